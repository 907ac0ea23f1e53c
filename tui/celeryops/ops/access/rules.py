"""Least privilege on a shared Redis: the ACL rules of each celeryops role (Redis >= 7.0).

``celeryops acl ROLE`` prints one line of rules, to put after ``ACL SETUSER <name> on ><password>``. Each role gets
the least it needs, derived from the key schema:

- celeryops' own keys: ``celeryops:{<fleet>}:*`` (``core.namespace.fleet_key``): the run lease
  (``lease``, ``lease:alive``), the published status (``status`` hash, ``events`` stream), the journal's fleet copy
  (``run:<id>``, ``run:<id>:records``, ``runs``, ``ended``), the drain fence (``fence``) and its worker registry
  (``fence:workers``);
- the slot pools: ``<prefix>:{<pool>}:pool|leases|waitq|waitx|hosts|hostinfo`` and ``<prefix>:pools`` (prefix
  ``resource`` by default; the seed's legacy ``<prefix>:<type>:total|used``, ``<prefix>:task:<id>``), changed only by
  the slot scripts (EVALSHA; the commands inside a script are checked against the same rules);
- kombu's Redis transport (``kombu/transport/redis.py``): a queue is a list named after it (with a priority:
  ``<queue>\\x06\\x16<n>``), bindings are sets ``_kombu.binding.<exchange>`` (plus ``_kombu.binding_deadlines``
  and ``_kombu.binding_permanent.<exchange>``, written by a Lua script), delivered-but-unacked messages sit in
  ``unacked`` (hash), ``unacked_index`` (sorted set) and ``unacked_mutex``; a fanout exchange (remote control
  ``celery.pidbox``, events ``celeryev``) is a PUBLISH on ``/<db>.<exchange>[/<routing key>]``, subscribed with
  PSUBSCRIBE; replies to remote control go to lists ``<uuid>.reply.celery.pidbox``;
- Celery's Redis result backend: ``celery-task-meta-<id>`` (and ``-taskset-``/``-chord-`` keys) plus a PUBLISH on
  the key's name.

Roles:

- **watcher**: reads what the console, ``status`` and ``watch`` show (``%R~``: read-only key patterns; the slot
  pools' is ``~`` because the snapshot is a script, whose commands are still only the watcher's read commands) and
  subscribes to task events; no write command, no PUBLISH (so no remote-control command either), no admin command;
  ``INFO`` for the broker's safety. ``CONFIG`` is given to no role: ``CONFIG GET`` would show ``requirepass``.
- **operator**: drain, deploy, abort, resume, rollback: the watcher's reads, writes on celeryops' keys (lease,
  fence, status, journal copy), remote control (PUBLISH on the pidbox channel, its reply queues and their binding),
  the event receiver's binding; queues, slot pools and kombu's task bindings stay read-only.
- **worker**: Celery's own needs on the queues it consumes (lists, bindings, unacked), remote control replies and
  events, the result backend (``results=True``), the fence plugin (reads the fence, writes its registry entry) and
  the slot scripts on the pools.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from celeryops.core.namespace import fleet_key

Role = Literal["watcher", "operator", "worker"]
ROLES: tuple[Role, ...] = ("watcher", "operator", "worker")

# Every connection: handshake, database selection, a client name (watch mode names its connections), INFO (the
# broker_safety check), RESET/QUIT.
CONNECT = ("ping", "hello", "auth", "client|setname", "client|getname", "client|id", "select", "reset", "quit",
           "info", "echo")
READ = ("get", "mget", "exists", "type", "ttl", "pttl", "hget", "hmget", "hgetall", "hlen", "hexists", "hkeys",
        "llen", "lrange", "lindex", "smembers", "sismember", "scard", "sscan", "zrange", "zrangebyscore", "zrevrange",
        "zrevrangebyscore", "zcard",
        "zscore", "zcount", "xrange", "xrevrange", "xlen", "time", "scan", "pubsub|numpat", "pubsub|numsub",
        "pubsub|channels")
SCRIPTS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "script|load", "script|exists")  # checked inside too
TRANSACTIONS = ("multi", "exec", "discard")  # atomic reads (a transaction's commands are checked one by one)
SUBSCRIBE = ("subscribe", "psubscribe", "unsubscribe", "punsubscribe")
WRITE = ("set", "del", "unlink", "expire", "pexpire", "persist", "hset", "hsetnx", "hdel", "hincrby", "hmset",
         "lpush", "rpush", "lrem", "rpop", "brpop", "sadd", "srem", "zadd", "zrem", "zremrangebyrank", "xadd", "xtrim",
         "multi", "exec",
         "discard", "watch", "unwatch")
PUBLISH = ("publish",)
# kombu's consumer: it also pops task messages, restores unacked ones, and counts queue lengths in pipelines; the
# slots' waker thread blocks on its pool's wake list (BLPOP).
WORKER_EXTRA = ("lpop", "blpop", "setex", "psetex", "getdel", "zrevrangebyscore", "zremrangebyscore", "incr", "decr",
                "hincrbyfloat", "pexpireat", "expireat")


PRIORITY_SEP = "\x06\x16"  # kombu: a queue's priority list is <queue><sep><priority> (transport option "sep")


@dataclass(frozen=True)
class KeySchema:
    """Where a fleet's keys live. ``queues``: the task queues (key patterns: a queue's priority lists are matched
    by ``<queue><priority_sep>[0-9]*``, kombu's ``<queue>\x06\x16<priority step>``); ``db``: the broker's Redis
    database (in the fanout channel names); ``keyprefix``: kombu's ``global_keyprefix``; ``control``: Celery's
    ``control_exchange``; ``results``: the result backend is this Redis."""

    fleet: str = "default"
    queues: tuple[str, ...] = ("celery",)
    db: int = 0
    keyprefix: str = ""
    control: str = "celery"
    events: str = "celeryev"
    slots_prefix: str = "resource"
    results: bool = False
    priority_sep: str = PRIORITY_SEP
    extra: tuple[str, ...] = field(default=())

    def ours(self, *parts: str) -> str:
        return fleet_key(self.fleet, *parts)

    def kombu(self, name: str) -> str:
        return self.keyprefix + name

    @property
    def pidbox_channel(self) -> str:
        return f"{self.keyprefix}/{self.db}.{self.control}.pidbox"

    @property
    def events_channel(self) -> str:
        """Published as ``/<db>.celeryev/<routing key>``; an event receiver PSUBSCRIBEs ``/<db>.celeryev/*`` (kombu
        turns ``#`` into ``*``), a pattern the ACL matches literally."""
        return f"{self.keyprefix}/{self.db}.{self.events}/*"

    @property
    def reply_queues(self) -> str:
        return self.kombu(f"*.reply.{self.control}.pidbox*")


def _commands(*groups: Sequence[str]) -> list[str]:
    return [f"+{c}" for c in dict.fromkeys(c for g in groups for c in g)]


ROUND_REPLIES = "celeryops.*.reply"  # the reply lists of celeryops' remote-control rounds (adapters/pidround.py)


#: A byte that is neither a control character, a space nor outside ASCII: one that survives an unquoted ``$(...)``
#: in bash and zsh as it is. Every other byte of a rule is spelled :data:`ODD_BYTE` on the printed line.
GRAPHIC = range(0x21, 0x7F)
#: A Redis glob for one byte that is not in :data:`GRAPHIC` (``[^!-~]``): it covers a control character (kombu's
#: priority separator ``\x06\x16``) without writing it, and no letter, digit or punctuation.
ODD_BYTE = "[^!-~]"


def shell_word(rule: str) -> str:
    """``rule`` spelled for a shell: the same Redis pattern, but each byte that is a control character, a space or
    not ASCII (a queue's priority lists: ``<queue>\x06\x16[0-9]*``) written :data:`ODD_BYTE`. Such a word holds no
    character that an unquoted ``$(...)`` splits on (bash and zsh) or drops from an argument, and redis-cli reads
    it as it is too. It matches what the rule matches, and besides only names with bytes of the same kind in those
    places (``celery[^!-~][^!-~][0-9]*``: ``celery`` then two such bytes then a digit), which Celery, kombu and
    celeryops never make."""
    return "".join(chr(b) if b in GRAPHIC else ODD_BYTE for b in rule.encode())


def rules(role: Role, schema: KeySchema = KeySchema()) -> str:
    """One line of ACL rules for ``role``, to follow ``ACL SETUSER <name> on ><password>`` in a shell (an unquoted
    ``$(celeryops acl ROLE)``) or in redis-cli (:func:`shell_word`; :func:`rule_args` has the exact rules). It
    starts by taking away whatever the user had (``resetkeys resetchannels -@all``), so the line can be applied
    again."""
    return " ".join(shell_word(r) for r in rule_args(role, schema))


def rule_args(role: Role, schema: KeySchema = KeySchema()) -> list[str]:
    """The rules of ``role`` as ACL SETUSER arguments (raw: a client library sends them as they are)."""
    s = schema
    ours_all = s.ours("*")
    # A queue is its own key plus its priority lists: never "<queue>*", which for "celery" would match celeryops'
    # own keys too.
    queues = [k for q in s.queues for k in (s.kombu(q), s.kombu(q) + s.priority_sep + "[0-9]*")]
    # The slot pools' wake queues (celeryops.slots.<prefix>.<pool>, with their priority lists): every worker of a
    # pool consumes its pool's, so they are task queues like the others (the watcher and operator read their depth).
    queues.append(s.kombu(f"celeryops.slots.{s.slots_prefix}.*"))
    slots = f"{s.slots_prefix}:*"
    bindings = s.kombu("_kombu.binding.*")
    # The slot pools are read by a script (EVALSHA: Redis counts its keys as read-write), so their pattern is not
    # %R~; the watcher still writes nothing there, as every command a script calls is checked against its (read-only)
    # commands.
    reads = [f"%R~{ours_all}", f"%R~{bindings}", f"~{slots}", *(f"%R~{q}" for q in queues)]
    head = ["resetkeys", "resetchannels", "-@all"]
    if role == "watcher":
        parts = [*head, *_commands(CONNECT, READ, TRANSACTIONS, SCRIPTS, SUBSCRIBE), *reads, f"&{s.events_channel}"]
    elif role == "operator":
        own_bindings = [s.kombu(f"_kombu.binding{sep}{x}") for x in (f"reply.{s.control}.pidbox", s.events)
                        for sep in (".", "_permanent.")]
        keys = [f"~{ours_all}", f"%R~{bindings}", f"%R~{slots}", *(f"%R~{q}" for q in queues),
                *(f"~{b}" for b in own_bindings), f"~{s.kombu('_kombu.binding_deadlines')}", f"~{s.reply_queues}",
                f"~{s.kombu(ROUND_REPLIES)}",  # celeryops' own remote-control rounds (adapters/pidround.py)
                f"~{s.kombu(s.events + '.*')}",  # the task-event receiver's queue (a drain wakes on task events)
                # kombu's consumer sweeps unacked messages past their visibility timeout under this mutex
                f"~{s.kombu('unacked_mutex')}", f"%R~{s.kombu('unacked')}", f"%R~{s.kombu('unacked_index')}"]
        parts = [*head, *_commands(CONNECT, READ, SCRIPTS, SUBSCRIBE, WRITE, PUBLISH), *keys,
                 f"&{s.pidbox_channel}", f"&{s.events_channel}"]
    elif role == "worker":
        keys = [*(f"~{q}" for q in queues), f"~{bindings}", f"~{s.kombu('_kombu.binding_deadlines')}",
                f"~{s.kombu('_kombu.binding_permanent.*')}", f"~{s.kombu('unacked')}",
                f"~{s.kombu('unacked_index')}", f"~{s.kombu('unacked_mutex')}",
                f"~{s.kombu(f'*.{s.control}.pidbox*')}",  # its own pidbox queue (declared) and the reply queues
                f"~{s.kombu(ROUND_REPLIES)}",  # replies to celeryops' remote-control rounds
                f"%R~{s.ours('fence')}", f"~{s.ours('fence', 'workers')}", f"~{slots}"]
        channels = [f"&{s.pidbox_channel}", f"&{s.events_channel}", f"&{s.kombu(f'/{s.db}.{s.events}/worker.*')}"]
        if s.results:
            keys += [f"~{s.kombu(p)}" for p in ("celery-task-meta-*", "celery-taskset-meta-*", "chord-unlock-*")]
            channels.append(f"&{s.kombu('celery-task-meta-*')}")
        parts = [*head, *_commands(CONNECT, READ, SCRIPTS, SUBSCRIBE, WRITE, PUBLISH, WORKER_EXTRA), *keys,
                 *channels]
    else:
        raise ValueError(f"unknown role {role!r}")
    return [*parts, *s.extra]


def describe(role: Role) -> str:
    """What ``role`` may do, in one sentence."""
    return {
        "watcher": "reads what the console, `status` and `watch` show and subscribes to task events; writes nothing "
                   "and sends no remote-control command",
        "operator": "drain, deploy, abort, resume and rollback: writes celeryops' keys (lease, fence, status, "
                    "journal copy) and sends remote-control commands; queues and slot pools stay read-only",
        "worker": "consumes and acknowledges tasks (kombu's queues, bindings and unacked messages), answers remote "
                  "control, sends events, stores results, reads the fence, keeps its fence registry entry and runs "
                  "the slot scripts",
    }[role]
