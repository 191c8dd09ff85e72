import pytest

from allocator import InvalidRequest
from workloads.report import build_report, strategy_report
from workloads.simulator import STRATEGIES, SimConfig, Simulator, simulate


@pytest.fixture(scope="module")
def reports(excerpt):
    sims = {s: simulate(excerpt, SimConfig(strategy=s)) for s in STRATEGIES}
    return sims, {s: strategy_report(sim) for s, sim in sims.items()}


def test_paged_keeps_almost_all_allocated_memory_in_token_states(reports):
    _, r = reports
    # 16-token blocks waste at most 15 slots per request of ~1,300 tokens.
    assert r["paged"]["token_state_share"] >= 0.96
    assert r["paged"]["external_waste_share"] == 0


def test_contiguous_max_is_far_below_paged_and_oracle_in_between(reports):
    _, r = reports
    assert r["contiguous-max"]["token_state_share"] < 0.4
    assert (r["contiguous-max"]["token_state_share"] < r["contiguous-oracle"]["token_state_share"]
            < r["paged"]["token_state_share"])
    assert r["contiguous-oracle"]["internal_waste_share"] == pytest.approx(0, abs=1e-9)


def test_shares_of_allocated_memory_sum_to_one(reports):
    _, r = reports
    for row in r.values():
        total = row["token_state_share"] + row["reserved_share"] + row["internal_waste_share"]
        assert total == pytest.approx(1.0, abs=1e-9)


def test_every_request_completes_and_frees_everything(reports, excerpt):
    sims, r = reports
    for name, sim in sims.items():
        assert r[name]["completed"] == len(excerpt) - r[name]["rejected_too_long"]
        assert sim.pool.used_blocks == 0, name
        assert sim.pool.check() == [], name
        assert len(sim.pool) == 0


def test_small_pool_preempts_and_still_drains(excerpt):
    for strategy in ("paged", "contiguous-pow2"):
        sim = simulate(excerpt, SimConfig(strategy=strategy, pool_tokens=20_000, max_len=8192))
        row = strategy_report(sim)
        assert row["completed"] == len(excerpt) - row["rejected_too_long"]
        assert sim.pool.used_blocks == 0 and sim.pool.check() == []
        assert row["preemptions"] > 0
        assert row["ooms"]["capacity"] + row["ooms"]["fragmentation"] > 0


def test_pow2_moves_or_fragments_on_a_tight_pool(excerpt):
    row = strategy_report(simulate(excerpt, SimConfig(strategy="contiguous-pow2", pool_tokens=20_000)))
    assert row["pool_moves"] > 0 or row["ooms"]["fragmentation"] > 0


def test_same_input_gives_the_same_report(excerpt):
    def run():
        sims = [simulate(excerpt, SimConfig(strategy=s, pool_tokens=30_000)) for s in STRATEGIES]
        report = build_report(sims, excerpt.summary())
        for row in report["strategies"].values():
            row.pop("wall_s")
        return report

    assert run() == run()


def test_bad_configuration_is_rejected(excerpt):
    with pytest.raises(InvalidRequest, match="unknown strategy"):
        Simulator(excerpt, SimConfig(strategy="buddy"))
    with pytest.raises(InvalidRequest, match="must hold one max-length sequence"):
        Simulator(excerpt, SimConfig(pool_tokens=1000))
    with pytest.raises(InvalidRequest, match="unknown model"):
        Simulator(excerpt, SimConfig(model="gpt-9"))
