"""The fence writer used by the operator's run (and the reader used by workers): one Redis hash with a TTL.

Key: ``celeryops:{<fleet>}:fence`` (hash: run_id, queues, exempt_revisions, exempt_versions, only_revisions as JSON
lists, owner, created, renewed as Redis TIME, ttl_ms). The run renews it every ttl/3 from its heartbeat; if the run
dies the key expires and workers resume by themselves. Every write that depends on the owner is a Lua compare-and-set on
``run_id``, so a second run can neither renew, rescope nor lift someone else's fence.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import redis

from celeryops.core.errors import EXIT_PREFLIGHT, UserError
from celeryops.core.namespace import fleet_key, fleet_name
from celeryops.fence.record import FenceRecord, decode

_NOW = "local t = redis.call('TIME') local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))\n"

# KEYS[1] fence; ARGV run_id, queues, exempt_revisions, exempt_versions, owner, ttl_ms, only_revisions
_RAISE = _NOW + """
local cur = redis.call('HGET', KEYS[1], 'run_id')
if cur and cur ~= ARGV[1] then
  return {0, cur, redis.call('HGET', KEYS[1], 'owner') or ''}
end
if not cur then redis.call('HSET', KEYS[1], 'created', now) end
redis.call('HSET', KEYS[1], 'run_id', ARGV[1], 'queues', ARGV[2], 'exempt_revisions', ARGV[3],
           'exempt_versions', ARGV[4], 'owner', ARGV[5], 'renewed', now, 'ttl_ms', ARGV[6],
           'only_revisions', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {1, cur or '', ''}
"""

# KEYS[1] fence; ARGV run_id, ttl_ms
_RENEW = """
if redis.call('HGET', KEYS[1], 'run_id') ~= ARGV[1] then return 0 end
""" + _NOW + """
redis.call('HSET', KEYS[1], 'renewed', now, 'ttl_ms', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS[1] fence; ARGV run_id, then field/value pairs to set (only those that change)
_RESCOPE = """
if redis.call('HGET', KEYS[1], 'run_id') ~= ARGV[1] then return 0 end
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
"""

# KEYS[1] fence; ARGV run_id
_LIFT = """
if redis.call('HGET', KEYS[1], 'run_id') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""


class FenceConflict(UserError):
    """Another run holds the fence of this fleet."""

    def __init__(self, fleet: str, run_id: str, owner: str) -> None:
        super().__init__(
            f"the drain fence of fleet {fleet!r} is held by run {run_id} ({owner or 'unknown owner'}), so nothing "
            "was changed; wait for that run to finish or recover it, then try again",
            EXIT_PREFLIGHT,
        )
        self.fleet = fleet
        self.run_id = run_id
        self.owner = owner


def _ms(ttl: float) -> int:
    if ttl <= 0:
        raise ValueError(f"fence ttl must be positive, got {ttl}")
    return max(1, round(ttl * 1000))


def _names(values: Sequence[str]) -> str:
    if isinstance(values, str):  # a bare "celery" would otherwise become ["c", "e", ...]
        values = [values]
    return json.dumps([str(v) for v in values])


class FenceStore:
    """Raise, renew, rescope, lift and read the drain fence of one fleet."""

    def __init__(self, client: redis.Redis, fleet: str | None = None) -> None:
        self.client = client
        self.fleet = fleet_name(fleet)
        self.key = fleet_key(self.fleet, "fence")
        self._raise = client.register_script(_RAISE)
        self._renew = client.register_script(_RENEW)
        self._rescope = client.register_script(_RESCOPE)
        self._lift = client.register_script(_LIFT)

    def raise_fence(
        self,
        run_id: str,
        queues: Sequence[str],
        owner: str,
        ttl: float,
        exempt_revisions: Sequence[str] = (),
        exempt_versions: Sequence[str] = (),
        only_revisions: Sequence[str] = (),
    ) -> None:
        """Put the fence up for ``run_id`` (``queues`` empty or ``["*"]``: every queue a worker consumes); with
        ``only_revisions`` it holds only the workers of those Cloud Run revisions.

        Idempotent for the same run (recovery may raise it again: scope and TTL are replaced, ``created`` kept).
        Raises FenceConflict, changing nothing, when another run holds it."""
        reply = self._raise(
            keys=[self.key],
            args=[run_id, _names(queues), _names(exempt_revisions), _names(exempt_versions), owner, _ms(ttl),
                  _names(only_revisions)],
        )
        ok, holder, holder_owner = (decode(v) or "" for v in reply)
        if ok != "1":
            raise FenceConflict(self.fleet, holder, holder_owner)

    def renew(self, run_id: str, ttl: float) -> bool:
        """Extend the TTL if the fence is still ours; False if it expired or belongs to another run."""
        return int(self._renew(keys=[self.key], args=[run_id, _ms(ttl)])) == 1

    def rescope(
        self,
        run_id: str,
        *,
        queues: Sequence[str] | None = None,
        exempt_revisions: Sequence[str] | None = None,
        exempt_versions: Sequence[str] | None = None,
        only_revisions: Sequence[str] | None = None,
    ) -> bool:
        """Replace the held queues, exemptions and/or revision scope (None: unchanged) if the fence is ours; False
        otherwise."""
        args: list[str] = [run_id]
        for field, value in (("queues", queues), ("exempt_revisions", exempt_revisions),
                             ("exempt_versions", exempt_versions), ("only_revisions", only_revisions)):
            if value is not None:
                args += [field, _names(value)]
        return int(self._rescope(keys=[self.key], args=args)) == 1

    def lift(self, run_id: str) -> bool:
        """Compare-and-delete: remove the fence only if ``run_id`` holds it. True if it was removed."""
        return int(self._lift(keys=[self.key], args=[run_id])) == 1

    def read(self) -> FenceRecord | None:
        """The fence now, or None when there is none (never raised, lifted or expired)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(self.key)
        pipe.pttl(self.key)
        raw, pttl = pipe.execute()
        if not raw:
            return None
        fields = {decode(k) or "": decode(v) or "" for k, v in raw.items()}
        if not fields.get("run_id"):
            return None
        return FenceRecord.from_hash(fields, int(pttl))
