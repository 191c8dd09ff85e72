"""Helpers shared by more than one test folder, imported as `support.<module>` (pyproject's
pytest `pythonpath` puts tests/ on the path): `apputil` (an in-process app, a real uvicorn,
error-shape assertions), `kvtest_util` (recordings to damage, churn drivers), `kve_source`
(reference KV-event sources). A helper only one folder uses stays in that folder."""
