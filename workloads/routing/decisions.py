"""Every routing decision, in every mode: one record per routed request and policy.

A record (`DecisionLog.record(i)`, one JSON object per line in `kvscope route --decisions FILE`):

- `request`: the request's 0-based line in the trace; `policy`, `replicas`, `capacity_tokens`;
- `replica`: the 0-based replica that served it;
- `rule`: what decided, one word (`RULES`): `round_robin`, `random`, `least_loaded`,
  `power_of_two`, `session` (a hash of the first block), `match` (the best cached prefix won),
  `low_match` (too little cached: the load decided), `imbalance` (the load rule overrode the
  cache), `score` (the lowest cost or highest score of a formula), `only` (one replica),
  `router` (a real router decided: `kvscope route --router`, whose reasons are its own);
  `why`: the policy's own sentence for it;
- `candidates`: per replica, `matched_blocks` (its cached leading blocks of the request when it
  was routed: the replicas' real caches), `load` (requests in flight there: everything routed so
  far in sequence and live modes) and `score` (the policy's number for it where it has one:
  Dynamo's and vLLM kv_aware's cost, lower wins; llm-d's score, higher wins; else null);
- `best_matched_blocks`: the most any replica held; `available_tokens`: those blocks' prompt
  tokens (what the best choice would have found cached); `captured_tokens`: what the request
  found cached on the replica that served it (serving mode: at its first admission; null for a
  request that was never admitted).

The log keeps records compactly (one tuple each) and at most `keep` of them; later ones are
counted in `dropped`. Reading is by page (`page(offset, limit, rule=, replica=)`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

RULES = ("round_robin", "random", "least_loaded", "power_of_two", "session", "match",
         "low_match", "imbalance", "score", "only", "router")
MAX_KEEP = 500_000  # records one log holds (about 100 bytes of tuples each, more for large N)


def rule_of(policy) -> str:
    """The one-word rule of the policy's last decision (its `kind`)."""
    kind = getattr(policy, "kind", "") or ""
    return kind if kind in RULES else "score"


def scores_of(policy, n: int) -> tuple | None:
    for attr in ("last_scores", "last_logits"):
        values = getattr(policy, attr, None)
        if values is not None and len(values) == n:
            return tuple(round(float(v), 6) for v in values)
    return None


class DecisionLog:
    """The decisions of one policy over one (N, capacity). Thread-safe: a run's thread appends
    while the server's loop reads pages."""

    def __init__(self, policy: str, replicas: int, capacity_tokens: int,
                 keep: int = MAX_KEEP) -> None:
        self.policy, self.replicas, self.capacity_tokens = policy, replicas, capacity_tokens
        self.keep = keep
        self.dropped = 0
        self._rows: list[list] = []  # in request order
        self._at: dict[int, list] = {}  # request index -> its row, for `captured` set later
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, req, replica: int, cluster, policy, captured: int | None = None,
            available: int | None = None, policy_name: str | None = None) -> None:
        """Record the decision just made for `req` (call right after `policy.route`).
        `policy_name`: the policy of this one decision, where a log's policy changes (a live
        run's switch)."""
        if len(self._rows) >= self.keep:
            self.dropped += 1
            return
        matches = tuple(cluster.matches(req))
        best = max(matches) if matches else 0
        if available is None:
            available = req.prefix_tokens(best)
        row = [req.index, replica, rule_of(policy), getattr(policy, "rule", "") or "", matches,
               tuple(cluster.requests), scores_of(policy, len(matches)), best, captured, available,
               policy_name]
        self._append(row)

    def _append(self, row: list) -> None:
        """Keep the rows in request order: a record that arrives after a later request's (a real
        router's requests reach the engines a little out of order) is put in its place."""
        with self._lock:
            rows = self._rows
            self._at[row[0]] = row
            if not rows or rows[-1][0] <= row[0]:
                rows.append(row)
                return
            at = len(rows) - 1
            while at > 0 and rows[at - 1][0] > row[0]:
                at -= 1
            rows.insert(at, row)

    def add_record(self, request: int, replica: int, rule: str, why: str, matches, loads,
                   scores, best: int, captured: int | None, available: int | None) -> None:
        """Record a decision made elsewhere (a real router's, seen at the engines)."""
        if len(self._rows) >= self.keep:
            self.dropped += 1
            return
        row = [request, replica, rule, why, tuple(matches), tuple(loads), scores, best, captured,
               available, None]
        self._append(row)

    def captured(self, request: int, tokens: int | None) -> None:
        """Set what request `request` found cached where it was served (known after routing)."""
        row = self._at.get(request)
        if row is not None:
            row[8] = tokens

    def _dict(self, row) -> dict:
        index, replica, rule, why, matches, loads, scores, best, captured, available, name = row
        return {"request": index, "policy": name or self.policy, "replicas": self.replicas,
                "capacity_tokens": self.capacity_tokens, "replica": replica, "rule": rule,
                "why": why,
                "candidates": [{"replica": r, "matched_blocks": matches[r], "load": loads[r],
                                "score": None if scores is None else scores[r]}
                               for r in range(len(matches))],
                "best_matched_blocks": best, "captured_tokens": captured,
                "available_tokens": available}

    def records(self) -> Iterator[dict]:
        with self._lock:
            rows = list(self._rows)
        for row in rows:
            yield self._dict(row)

    def page(self, offset: int = 0, limit: int = 100, *, rule: str | None = None,
             replica: int | None = None, request: int | None = None) -> tuple[list[dict], int]:
        """Records `offset` .. `offset + limit` of those matching the filters, and how many match."""
        with self._lock:
            rows = self._rows
            if rule is not None or replica is not None or request is not None:
                rows = [r for r in rows if (rule is None or r[2] == rule)
                        and (replica is None or r[1] == replica)
                        and (request is None or r[0] == request)]
            total = len(rows)
            chosen = rows[offset:offset + limit]
            return [self._dict(r) for r in chosen], total

    def latest(self, n: int) -> list[dict]:
        """The last `n` decisions in the short form a run's view explains them in: request,
        replica, policy, the policy's sentence as `rule`, and each replica's cached leading
        blocks (`matches`) and load (`loads`) then."""
        with self._lock:
            rows = self._rows[-n:] if n > 0 else []
            return [{"request": r[0], "replica": r[1], "policy": r[10] or self.policy, "rule": r[3],
                     "matches": list(r[4]), "loads": list(r[5])} for r in rows]

    def summary(self) -> dict:
        """Decisions by rule and by replica, and the captured / available token totals."""
        with self._lock:
            rows = list(self._rows)
        by_rule: dict[str, int] = {}
        by_replica = [0] * self.replicas
        captured = available = 0
        for r in rows:
            by_rule[r[2]] = by_rule.get(r[2], 0) + 1
            if 0 <= r[1] < self.replicas:
                by_replica[r[1]] += 1
            captured += r[8] or 0
            available += r[9] or 0
        return {"policy": self.policy, "decisions": len(rows), "dropped": self.dropped,
                "by_rule": by_rule, "by_replica": by_replica, "captured_tokens": captured,
                "available_tokens": available}

    def rows(self) -> list[list]:
        """The raw rows (for shipping a log between processes; `from_rows` rebuilds it)."""
        with self._lock:
            return [list(r) for r in self._rows]

    @classmethod
    def from_rows(cls, policy: str, replicas: int, capacity_tokens: int, rows: list,
                  dropped: int = 0) -> DecisionLog:
        log = cls(policy, replicas, capacity_tokens)
        log._rows = [list(r) for r in rows]
        log._at = {r[0]: r for r in log._rows}
        log.dropped = dropped
        return log

    def write_jsonl(self, f) -> int:
        n = 0
        for rec in self.records():
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            n += 1
        return n
