"""Settings for every test directory: property tests check behaviour, never speed (speed is the
benchmarks' job), so a loaded CI machine must not fail them on hypothesis's timing checks."""

from hypothesis import HealthCheck, settings

settings.register_profile("kvscope", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kvscope")
