"""Typed configuration of lightning-ncclx.

Plain keyword-only dataclasses, importable without torch or Lightning, and the only place the
defaults are written: Hydra's ``ncclx/default.yaml`` lists this schema (registered in the
ConfigStore by ``hydra_store``) and holds only comments.
Every check lives in ``__post_init__`` and raises :class:`~lightning_ncclx.errors.ConfigError`
naming the dotted key and the bad value. With OmegaConf, ``__post_init__`` only runs at
``OmegaConf.to_object``: use :func:`ncclx_config_from` to convert before use.

Example::

    from lightning_ncclx.config import NcclxConfig, WatchdogConfig
    cfg = NcclxConfig(watchdog=WatchdogConfig(train_step_seconds=120.0))
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Mapping

from lightning_ncclx.errors import ConfigError

BACKEND_CHOICES = ("auto", "nccl2", "nccl-legacy", "nccl-lazy", "gloo")


class StallAction(str, Enum):
    """What the watchdog does once a stall has been dumped and summarized."""

    dump = "dump"
    """Write the dumps and the summary, then keep waiting (the job may recover)."""
    dump_and_exit = "dump_and_exit"
    """Write the dumps and the summary, then end every rank with ``exit_code``."""


HANG_KINDS = ("program_divergence", "argument_mismatch", "stuck_outside_collective", "rank_lost",
              "collective_stalled", "program_stalled", "teardown", "unknown", "no_hang")
"""The values of :class:`lightning_ncclx.analysis.kind.HangKind` (kept here: config imports no analysis)."""

DEFAULT_EXIT_CODES = {"program_divergence": 76, "argument_mismatch": 76, "teardown": 76, "program_stalled": 76,
                      "stuck_outside_collective": 75, "rank_lost": 75, "collective_stalled": 75, "unknown": 75}
"""Kinds a restart cannot fix (the program must change; or training had ended) end with 76, the
others with 75 (EX_TEMPFAIL: worth a restart)."""


class EnvPrecedence(str, Enum):
    """Who wins when a recorder variable is already set in the environment."""

    config = "config"
    """The config's value is exported; the user's differing value is reported and replaced."""
    environment = "environment"
    """The user's value is kept; the config's differing value is reported and ignored."""


MAX_BUFFER_SIZE = 2**31 - 1
"""torch parses ``TORCH_FR_BUFFER_SIZE`` into a C ``int`` (``std::stoi``; torch 2.13-2.15): from 2**31
to 2**32 - 1 group creation hangs, above that the process aborts (exit 134). Nothing is reserved up
front: each recorded collective holds about 0.8 KiB of host memory until the ring is full."""
MAX_SECONDS = 30 * 24 * 3600.0
"""Every duration is at most 30 days: a longer one is a typo or means "never" (switch the part off
instead), and a wait past ``threading.TIMEOUT_MAX`` raises OverflowError on the thread that waits."""
POLL_SECONDS_MIN = 0.01
"""Shortest poll interval of a helper thread: a shorter one is a busy loop beside training."""
MAX_COLLECT_TIMEOUT_SECONDS = 3600.0
MAX_MULTIPLIER = 1000.0
MAX_STEP_WINDOW = 10_000
"""The slowest step is taken over the window at every poll of the watchdog thread."""
MAX_FILE_NAME_BYTES = 255
MAX_PATH_BYTES = 4096


def _require(condition: bool, key: str, value: Any, why: str) -> None:
    if not condition:
        raise ConfigError(f"{key}={value!r} is not valid: {why}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _finite_positive(key: str, value: Any, at_most: float = MAX_SECONDS, why: str = "30 days") -> None:
    _require(_is_number(value) and 0 < value <= at_most, key, value,
             f"expected a finite number of seconds greater than 0 and at most {at_most:.0f} ({why})")


def _poll_seconds(key: str, value: Any, at_most: float, why: str) -> None:
    _require(_is_number(value) and POLL_SECONDS_MIN <= value <= at_most, key, value,
             f"expected a number of seconds from {POLL_SECONDS_MIN} (a shorter one is a busy loop beside "
             f"training) to {at_most:g} ({why})")


def _multiplier(key: str, value: Any, why: str) -> None:
    _require(_is_number(value) and 1.5 <= value <= MAX_MULTIPLIER, key, value,
             f"expected a number from 1.5 to {MAX_MULTIPLIER:.0f} ({why})")


def _check_booleans(config: Any, key: str) -> None:
    """Every ``bool`` field holds True or False: a string such as 'no' or 'false' would read as true."""
    for item in fields(config):
        if item.type in ("bool", bool):
            value = getattr(config, item.name)
            _require(isinstance(value, bool), f"{key}.{item.name}", value, "expected true or false")


def _sub_config(config_type: type, key: str, value: Any) -> Any:
    """``value`` as a ``config_type``: itself, or built from a mapping of its field names."""
    if isinstance(value, config_type):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}={value!r} is not valid: expected a mapping of {config_type.__name__} keys")
    names = [item.name for item in fields(config_type)]
    unknown = sorted(str(name) for name in value if name not in names)
    if unknown:
        raise ConfigError(f"{key} has no key(s) {unknown}; expected {', '.join(names)}")
    return config_type(**value)


def _name_bytes(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def _plain_name(key: str, value: Any, max_bytes: int, why: str) -> None:
    """A file name (or file-name prefix): no folder part, no NUL, no blank or padded text."""
    _require(isinstance(value, str) and value.strip() == value and value not in ("", ".", "..")
             and "/" not in value and "\0" not in value and _name_bytes(value) <= max_bytes, key, value, why)


def _enum(enum_type: type[Enum], key: str, value: Any) -> Any:
    try:
        return enum_type(value)
    except ValueError:
        choices = ", ".join(member.value for member in enum_type)  # type: ignore[attr-defined]
        raise ConfigError(f"{key}={value!r} is not valid: expected one of {choices}") from None


def _non_negative_int(key: str, value: Any) -> None:
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= 0, key, value, "expected an integer >= 0")


@dataclass(kw_only=True)
class FlightRecorderConfig:
    """torch's flight recorder, exported as ``TORCH_FR_*``/``TORCH_NCCL_*`` variables on every rank."""

    buffer_size: int = 20000
    """Entries kept per rank and backend (ring buffer), at most 2**31 - 1 (torch's limit). 0 turns
    the recorder off."""
    dump_on_timeout: bool = True
    """Let torch's NCCL watchdog write its own dump when a collective times out."""
    stack_traces: bool = True
    """Keep the Python call stack of each collective and write it into dumps (``frames``)."""
    cpp_stacks: bool = False
    """Also record C++ stacks (slow: use only to debug torch itself)."""
    timing: bool = False
    """Record CUDA start/end events per collective (``duration_ms``); costs a little per op."""
    dump_dir: str | None = None
    """Folder for every dump of this run. Default: ``<hydra output dir>/ncclx_dumps`` under
    Hydra, else ``<trainer.default_root_dir>/ncclx_dumps/<run id>``."""
    torch_dump_prefix: str = "nccl_trace_rank_"
    """File-name prefix of torch's own dump-on-timeout files, written in ``<dump_dir>/torch/``."""
    env_precedence: EnvPrecedence = EnvPrecedence.config
    """Which value wins when a variable is already set in the environment and disagrees."""

    def __post_init__(self) -> None:
        key = "ncclx.flight_recorder"
        _check_booleans(self, key)
        _require(isinstance(self.buffer_size, int) and not isinstance(self.buffer_size, bool)
                 and 0 <= self.buffer_size <= MAX_BUFFER_SIZE, f"{key}.buffer_size", self.buffer_size,
                 f"expected an integer from 0 to {MAX_BUFFER_SIZE} (torch reads it as a C int: a larger one hangs "
                 "group creation or aborts the process)")
        _plain_name(f"{key}.torch_dump_prefix", self.torch_dump_prefix, 200,
                    "expected a non-empty file-name prefix of at most 200 bytes, without '/', NUL or padding")
        if self.dump_dir is not None:
            path = os.fspath(self.dump_dir) if isinstance(self.dump_dir, (str, os.PathLike)) else None
            _require(isinstance(path, str) and bool(path.strip()) and "\0" not in path
                     and _name_bytes(path) <= MAX_PATH_BYTES, f"{key}.dump_dir", self.dump_dir,
                     f"expected a folder path (no NUL, at most {MAX_PATH_BYTES} bytes) or null")
        self.env_precedence = _enum(EnvPrecedence, f"{key}.env_precedence", self.env_precedence)


@dataclass(kw_only=True)
class TimeoutConfig:
    """Collective timeouts: long while the job starts, shorter once training runs steadily."""

    init_timeout_seconds: float = 1800.0
    """Timeout of group creation and of the first ``warmup_steps`` steps (compilation, first
    checkpoint load, lazy communicator set-up)."""
    training_timeout_seconds: float = 600.0
    """Timeout applied to every process group, on all ranks together, after the warm-up."""
    warmup_steps: int = 2
    """Training batches run with ``init_timeout_seconds`` before switching. 0 switches at once."""

    def __post_init__(self) -> None:
        key = "ncclx.timeouts"
        _check_booleans(self, key)
        _finite_positive(f"{key}.init_timeout_seconds", self.init_timeout_seconds)
        _finite_positive(f"{key}.training_timeout_seconds", self.training_timeout_seconds)
        _non_negative_int(f"{key}.warmup_steps", self.warmup_steps)
        if self.training_timeout_seconds > self.init_timeout_seconds:
            raise ConfigError(
                f"{key}.training_timeout_seconds={self.training_timeout_seconds} is longer than "
                f"{key}.init_timeout_seconds={self.init_timeout_seconds}: the start-up timeout must be "
                "the longer one"
            )


@dataclass(kw_only=True)
class AutoThresholdConfig:
    """A training-step stall threshold learned from the job's own step times."""

    enabled: bool = True
    """Tighten ``train_step_seconds`` to ``multiplier`` x the slowest recent step (never below
    ``floor_seconds``, never above ``train_step_seconds``) once ``warmup_steps`` have run."""
    multiplier: float = 10.0
    floor_seconds: float = 30.0
    warmup_steps: int = 20
    """Steps observed before the learned threshold is used."""
    window: int = 100
    """How many recent step times the slowest is taken over."""

    def __post_init__(self) -> None:
        key = "ncclx.watchdog.auto"
        _check_booleans(self, key)
        _multiplier(f"{key}.multiplier", self.multiplier, "a smaller one would flag ordinary step-time jitter")
        _finite_positive(f"{key}.floor_seconds", self.floor_seconds)
        _non_negative_int(f"{key}.warmup_steps", self.warmup_steps)
        _require(isinstance(self.window, int) and not isinstance(self.window, bool)
                 and 1 <= self.window <= MAX_STEP_WINDOW, f"{key}.window", self.window,
                 f"expected an integer from 1 to {MAX_STEP_WINDOW}")


@dataclass(kw_only=True)
class ConsensusConfig:
    """Fast hang detection from the ranks' own reports: which collective each one is blocked in."""

    enabled: bool = True
    """A rank whose training step has run ``wait`` without a heartbeat reports, once, whether it
    is blocked in a collective (group, op number) or busy elsewhere. When every rank has reported,
    at least ``quorum`` of them are blocked, none is in a phase that explains the wait
    (validation, checkpoint, compile, epoch start, teardown) and the picture is the same at two
    polls in a row, rank 0 starts the stall event without waiting for the step threshold."""
    multiplier: float = 3.0
    """``wait`` = ``multiplier`` x the slowest training step seen so far (a rank's waits in
    collectives are part of its steps), never below ``min_wait_seconds``."""
    min_wait_seconds: float = 2.0
    warmup_steps: int = 10
    """Training batches observed before a rank reports anything."""
    quorum: float = 0.5
    """Fraction of the ranks that must be blocked in a collective (the rest busy outside one)."""

    def __post_init__(self) -> None:
        key = "ncclx.watchdog.consensus"
        _check_booleans(self, key)
        _multiplier(f"{key}.multiplier", self.multiplier, "a smaller one takes an ordinary slow step for a hang")
        _finite_positive(f"{key}.min_wait_seconds", self.min_wait_seconds)
        _non_negative_int(f"{key}.warmup_steps", self.warmup_steps)
        _require(isinstance(self.quorum, (int, float)) and not isinstance(self.quorum, bool)
                 and 0.0 < self.quorum <= 1.0, f"{key}.quorum", self.quorum,
                 "expected a fraction of the ranks greater than 0 and at most 1")


@dataclass(kw_only=True)
class WatchdogConfig:
    """The stall watchdog: a daemon thread per rank fed by heartbeats at batch boundaries."""

    enabled: bool = True
    poll_interval_seconds: float = 0.5
    """How often the thread looks at the heartbeat and at dump requests from other ranks."""
    event_doorbell: bool = True
    """On a ``TCPStore``, learn of other ranks' dump events from one blocking store request per
    rank (a doorbell the starting rank rings) instead of a ``check`` per poll interval: no store
    traffic in steady state. False: poll the store every interval."""
    first_step_seconds: float = 900.0
    """Threshold for the first training step (compilation, warm-up, lazy NCCL set-up)."""
    train_step_seconds: float = 300.0
    """Threshold for an ordinary training step (upper bound of the ``auto`` threshold)."""
    validation_seconds: float = 500.0
    """Threshold for one validation batch, the validation epoch's start and end, and a training
    epoch's boundaries (epoch-end work; a later epoch's start until its first batch, while the
    loader's workers restart)."""
    checkpoint_seconds: float = 500.0
    """Threshold while a checkpoint is built and saved (all of ``Trainer.save_checkpoint``: state
    dicts, FSDP gathers, the write, its barrier), and for a step whose main thread is found
    inside checkpoint code."""
    teardown_seconds: float | None = None
    """Threshold after the last batch of fit, validate, test or predict: strategy teardown and
    ``on_fit_end`` until the watchdog stops. Null: ``validation_seconds``."""
    auto: AutoThresholdConfig = field(default_factory=AutoThresholdConfig)
    consensus: ConsensusConfig = field(default_factory=ConsensusConfig)
    on_stall: StallAction = StallAction.dump
    """``dump``: dump, summarize, keep waiting. ``dump_and_exit``: then end every rank."""
    exit_code: int = 75
    """Exit code of every rank after ``dump_and_exit`` (75 = EX_TEMPFAIL), for every hang kind
    that ``exit_codes`` does not name (and when the analysis failed)."""
    exit_codes: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_EXIT_CODES))
    """Exit code per hang kind after ``dump_and_exit``, so a job wrapper, torchrun's
    ``--max-restarts`` or SLURM's ``--requeue`` restarts only what a restart can fix."""
    max_dumps_per_run: int = 3
    """Coordinated stall dumps per run; later stalls are only logged."""
    dump_on_exception: bool = True
    """Write the failing rank's dump when training raises."""
    on_demand_signal: str | None = "SIGUSR2"
    """Signal that makes every rank dump (``kill -USR2 <pid>`` on any rank), also while the main
    thread is blocked in a collective; null disables."""
    on_demand_file: str | None = "DUMP_NOW"
    """``touch <dump_dir>/<this name>`` makes every rank dump (each host's local rank 0 looks for
    it every 2 s); null disables."""
    max_on_demand_dumps: int = 10
    """On-demand dumps per run; later requests are only logged."""
    native_stacks: bool = True
    """When the watchdog thread cannot run (the main thread holds the GIL in native code), let
    faulthandler write the rank's Python stacks after the phase's threshold, for the summary."""
    collect_timeout_seconds: float = 20.0
    """How long the summarizing rank waits for every rank's dump before summarizing anyway."""
    gather_through_store: bool = True
    """Copy every rank's dump to the summarizing rank through the job's store, so node-local
    dump folders still give a complete summary."""
    two_phase_gather_above_ranks: int = 64
    """In jobs of more ranks, the gather is two-phase: every rank sends a digest (the newest
    collectives of each group, a few KiB), the summarizing rank diagnoses them and then pulls
    full dumps only from the culprits and ``two_phase_gather_peers`` others; every other full
    dump stays on its own host. 0: always two-phase."""
    two_phase_gather_peers: int = 2
    """Ranks besides the culprits whose full dumps a two-phase gather pulls (for comparison)."""

    def two_phase_gather(self, world_size: int) -> bool:
        return self.gather_through_store and world_size > self.two_phase_gather_above_ranks

    def __post_init__(self) -> None:
        key = "ncclx.watchdog"
        _check_booleans(self, key)
        _poll_seconds(f"{key}.poll_interval_seconds", self.poll_interval_seconds, 5.0,
                      "a longer one notices stalls late and keeps other ranks' dump requests waiting")
        for name in ("first_step_seconds", "train_step_seconds", "validation_seconds", "checkpoint_seconds"):
            _finite_positive(f"{key}.{name}", getattr(self, name))
        _finite_positive(f"{key}.collect_timeout_seconds", self.collect_timeout_seconds, MAX_COLLECT_TIMEOUT_SECONDS,
                         "an hour: the summarizing rank waits this long for missing dumps")
        if self.teardown_seconds is not None:
            _finite_positive(f"{key}.teardown_seconds", self.teardown_seconds)
        self.auto = _sub_config(AutoThresholdConfig, f"{key}.auto", self.auto)
        self.consensus = _sub_config(ConsensusConfig, f"{key}.consensus", self.consensus)
        self.on_stall = _enum(StallAction, f"{key}.on_stall", self.on_stall)
        _require(
            isinstance(self.exit_code, int) and not isinstance(self.exit_code, bool) and 1 <= self.exit_code <= 255,
            f"{key}.exit_code",
            self.exit_code,
            "expected an exit code from 1 to 255",
        )
        _check_exit_codes(f"{key}.exit_codes", self.exit_codes)
        _non_negative_int(f"{key}.max_dumps_per_run", self.max_dumps_per_run)
        _non_negative_int(f"{key}.max_on_demand_dumps", self.max_on_demand_dumps)
        _non_negative_int(f"{key}.two_phase_gather_above_ranks", self.two_phase_gather_above_ranks)
        _non_negative_int(f"{key}.two_phase_gather_peers", self.two_phase_gather_peers)
        if self.on_demand_file is not None:
            _plain_name(f"{key}.on_demand_file", self.on_demand_file, MAX_FILE_NAME_BYTES,
                        "expected a plain file name inside the dump folder (no '/', NUL or padding), or null")
        if self.on_demand_signal is not None:
            _require(
                self.on_demand_signal in ("SIGUSR1", "SIGUSR2"),
                f"{key}.on_demand_signal",
                self.on_demand_signal,
                "expected SIGUSR2, SIGUSR1 or null (SIGUSR1 is SLURM's requeue signal in Lightning)",
            )
        if self.auto.enabled and self.auto.floor_seconds > self.train_step_seconds:
            raise ConfigError(
                f"{key}.auto.floor_seconds={self.auto.floor_seconds} is longer than "
                f"{key}.train_step_seconds={self.train_step_seconds}, the upper bound of the learned threshold"
            )


def _check_exit_codes(key: str, codes: Any) -> None:
    _require(isinstance(codes, Mapping), key, codes, "expected a mapping from hang kind to exit code")
    for kind, code in codes.items():
        _require(kind in HANG_KINDS, f"{key}.{kind}", code,
                 f"unknown hang kind; expected one of {', '.join(HANG_KINDS)}")
        _require(isinstance(code, int) and not isinstance(code, bool) and 1 <= code <= 255, f"{key}.{kind}", code,
                 "expected an exit code from 1 to 255 (0 would tell a job wrapper that the hung run succeeded)")


def exit_code_for(kind: Any, watchdog: WatchdogConfig) -> int:
    """The exit status for a job that ``dump_and_exit`` ends after a hang of ``kind`` (a
    ``HangKind``, its string value, or None when the analysis did not run).

    Example::

        exit_code_for("rank_lost", WatchdogConfig())           # 75: restart
        exit_code_for("program_divergence", WatchdogConfig())  # 76: fix the program first
    """
    name = getattr(kind, "value", kind)
    return int(watchdog.exit_codes.get(name, watchdog.exit_code)) if isinstance(name, str) else watchdog.exit_code


@dataclass(kw_only=True)
class StragglerConfig:
    """Live straggler detection: per-rank step timings compared across ranks every interval."""

    enabled: bool = True
    interval_steps: int = 100
    """Training batches per interval: each rank writes one summary of its timings per interval."""
    threshold: float = 1.2
    """A rank whose work (data fetch + forward + optimizer) is this many times the median of its
    peers' is above threshold for that interval."""
    patience: int = 3
    """Consecutive intervals above ``threshold`` before the warning; as many below close it."""
    poll_interval_seconds: float = 1.0
    """How often the reading rank's thread looks in the store for a complete interval."""
    cuda_events: bool = True
    """On CUDA, time forward/backward/optimizer with CUDA events read lazily by the helper thread
    (never a synchronize in the step); off: CPU clock only (what the host spends enqueuing)."""

    def __post_init__(self) -> None:
        key = "ncclx.straggler"
        _check_booleans(self, key)
        _require(isinstance(self.interval_steps, int) and not isinstance(self.interval_steps, bool)
                 and self.interval_steps >= 2, f"{key}.interval_steps", self.interval_steps,
                 "expected an integer >= 2 (a median over fewer batches is noise)")
        _require(isinstance(self.threshold, (int, float)) and not isinstance(self.threshold, bool)
                 and math.isfinite(self.threshold) and self.threshold > 1.0, f"{key}.threshold", self.threshold,
                 "expected a ratio greater than 1.0 (1.2: 20% slower than the median of the peers)")
        _require(isinstance(self.patience, int) and not isinstance(self.patience, bool) and self.patience >= 1,
                 f"{key}.patience", self.patience, "expected an integer >= 1")
        _poll_seconds(f"{key}.poll_interval_seconds", self.poll_interval_seconds, 60.0,
                      "a longer one reports stragglers minutes late")


_ENV_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def _env_name(key: str, value: Any) -> None:
    """``value`` must be the NAME of an environment variable; the value itself is never echoed
    (a URL or key pasted here by mistake is a secret)."""
    if value is None:
        return
    if not (isinstance(value, str) and value and not value[0].isdigit() and set(value) <= _ENV_NAME_CHARS
            and len(value) <= 128):
        raise ConfigError(f"{key} is not valid: expected the name of an environment variable (letters, digits, "
                          "'_'), not its value: put the secret in that variable")


@dataclass(kw_only=True)
class WebhookAlertConfig:
    """A JSON webhook (Slack incoming webhooks and similar tools accept it as is)."""

    url_env: str | None = None
    """Name of the environment variable that holds the webhook URL (the URL is a secret)."""


PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"


@dataclass(kw_only=True)
class PagerDutyAlertConfig:
    """PagerDuty Events API v2: trigger on a confirmed hang, resolve with the same dedup key."""

    routing_key_env: str | None = None
    """Name of the environment variable that holds the integration's routing key."""
    endpoint: str = PAGERDUTY_EVENTS_URL
    severity: str = "critical"
    """critical | error | warning | info."""


@dataclass(kw_only=True)
class AlertsConfig:
    """Alerts on confirmed hangs, sent by the rank that writes the summary (off by default)."""

    enabled: bool = False
    webhook: WebhookAlertConfig = field(default_factory=WebhookAlertConfig)
    pagerduty: PagerDutyAlertConfig = field(default_factory=PagerDutyAlertConfig)
    command: str | None = None
    """A local command (split like a shell line, run without a shell) with the alert file's path
    appended: a site hook."""
    attempt_timeout_seconds: float = 5.0
    """Bound on one delivery attempt to one sink."""
    attempts: int = 3
    """Tries per sink (backoff 1 s, 2 s, ... between them), within ``deadline_seconds``."""
    deadline_seconds: float = 20.0
    """Bound on all of one alert's delivery: also the most it can delay the exit of the summarizing rank."""
    confirm_seconds: float = 4.0
    """A stall pages once its summary is written and the heartbeat it is about has not moved for
    this long (or when the hang is confirmed for ``dump_and_exit``, if that comes first); a wait
    that ends sooner pages nobody, one that ends later sends the trigger's resolve. 4 s: above the
    consensus's 2 s floor, so the page follows the summary within about 2 s. Raise it where longer
    pauses are normal."""
    stragglers: bool = False
    """Also send a warning (PagerDuty severity ``warning``) when straggler detection names a slow rank."""
    straggler_min_interval_seconds: float = 600.0
    """At most one straggler warning per this many seconds for the whole job (0: one per episode)."""

    def __post_init__(self) -> None:
        key = "ncclx.alerts"
        _check_booleans(self, key)
        self.webhook = _sub_config(WebhookAlertConfig, f"{key}.webhook", self.webhook)
        self.pagerduty = _sub_config(PagerDutyAlertConfig, f"{key}.pagerduty", self.pagerduty)
        _env_name(f"{key}.webhook.url_env", self.webhook.url_env)
        _env_name(f"{key}.pagerduty.routing_key_env", self.pagerduty.routing_key_env)
        _require(isinstance(self.pagerduty.endpoint, str) and self.pagerduty.endpoint.startswith(("https://", "http://")),
                 f"{key}.pagerduty.endpoint", self.pagerduty.endpoint, "expected an http(s) URL")
        _require(self.pagerduty.severity in ("critical", "error", "warning", "info"), f"{key}.pagerduty.severity",
                 self.pagerduty.severity, "expected critical, error, warning or info")
        _require(self.command is None or (isinstance(self.command, str) and self.command.strip() != ""),
                 f"{key}.command", self.command, "expected a command line or null")
        _finite_positive(f"{key}.attempt_timeout_seconds", self.attempt_timeout_seconds)
        _finite_positive(f"{key}.deadline_seconds", self.deadline_seconds)
        _finite_positive(f"{key}.confirm_seconds", self.confirm_seconds)
        _require(isinstance(self.straggler_min_interval_seconds, (int, float))
                 and not isinstance(self.straggler_min_interval_seconds, bool)
                 and math.isfinite(self.straggler_min_interval_seconds)
                 and 0 <= self.straggler_min_interval_seconds <= 7 * 24 * 3600,
                 f"{key}.straggler_min_interval_seconds", self.straggler_min_interval_seconds,
                 "expected seconds from 0 (one warning per episode) to 604800 (a week)")
        _require(isinstance(self.attempts, int) and not isinstance(self.attempts, bool) and 1 <= self.attempts <= 10,
                 f"{key}.attempts", self.attempts, "expected an integer from 1 to 10")

    @property
    def has_sink(self) -> bool:
        return bool(self.webhook.url_env or self.pagerduty.routing_key_env or self.command)


@dataclass(kw_only=True)
class MetricsConfig:
    """Live Prometheus metrics of every rank (off by default: nothing is imported or started)."""

    port: int | None = None
    """Serve ``/metrics`` on this port plus the rank's local rank (8 ranks of a host: port..port+7)."""
    address: str = "0.0.0.0"
    """Interface the metrics server listens on."""
    textfile: str | None = None
    """A node_exporter textfile (``.../textfile/ncclx.prom``): the ranks of a host merge into it."""
    interval_seconds: float = 5.0
    """How often each rank writes its part of the textfile."""

    def __post_init__(self) -> None:
        key = "ncclx.metrics"
        if self.port is not None:
            _require(isinstance(self.port, int) and not isinstance(self.port, bool) and 1 <= self.port <= 65535,
                     f"{key}.port", self.port, "expected a TCP port from 1 to 65535, or null")
        _require(isinstance(self.address, str) and self.address.strip() != "", f"{key}.address", self.address,
                 "expected an interface address such as 0.0.0.0 or 127.0.0.1")
        if self.textfile is not None:
            _require(isinstance(self.textfile, str) and self.textfile.endswith(".prom") and "\0" not in self.textfile,
                     f"{key}.textfile", self.textfile,
                     "expected a path ending in .prom (node_exporter reads only those), or null")
        _finite_positive(f"{key}.interval_seconds", self.interval_seconds)

    @property
    def enabled(self) -> bool:
        return self.port is not None or self.textfile is not None


@dataclass(kw_only=True)
class NcclxConfig:
    """Everything lightning-ncclx configures: backend, flight recorder, timeouts, watchdog, straggler detection, alerts, metrics."""

    backend: str = "auto"
    """``auto`` (nccl on CUDA, gloo on CPU) | ``nccl2`` | ``nccl-legacy`` | ``nccl-lazy`` | ``gloo``."""
    flight_recorder: FlightRecorderConfig = field(default_factory=FlightRecorderConfig)
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def __post_init__(self) -> None:
        _require(
            self.backend in BACKEND_CHOICES,
            "ncclx.backend",
            self.backend,
            f"expected one of {', '.join(BACKEND_CHOICES)}",
        )
        self.flight_recorder = _sub_config(FlightRecorderConfig, "ncclx.flight_recorder", self.flight_recorder)
        self.timeouts = _sub_config(TimeoutConfig, "ncclx.timeouts", self.timeouts)
        self.watchdog = _sub_config(WatchdogConfig, "ncclx.watchdog", self.watchdog)
        self.straggler = _sub_config(StragglerConfig, "ncclx.straggler", self.straggler)
        self.alerts = _sub_config(AlertsConfig, "ncclx.alerts", self.alerts)
        self.metrics = _sub_config(MetricsConfig, "ncclx.metrics", self.metrics)
        if self.watchdog.enabled:
            _check_stall_shorter_than_timeout(self.watchdog, self.timeouts)


def _check_stall_shorter_than_timeout(watchdog: WatchdogConfig, timeouts: TimeoutConfig) -> None:
    """A stall must be noticed before the collective timeout aborts the process, or only the
    ranks blocked in the collective ever dump and the culprit is lost."""
    pairs = [
        ("first_step_seconds", watchdog.first_step_seconds, "init_timeout_seconds", timeouts.init_timeout_seconds),
    ]
    for name in ("train_step_seconds", "validation_seconds", "checkpoint_seconds", "teardown_seconds"):
        if getattr(watchdog, name) is None:
            continue
        pairs.append((name, getattr(watchdog, name), "training_timeout_seconds", timeouts.training_timeout_seconds))
    for stall_key, stall, timeout_key, timeout in pairs:
        if stall >= timeout:
            raise ConfigError(
                f"ncclx.watchdog.{stall_key}={stall} must be shorter than ncclx.timeouts.{timeout_key}={timeout}: "
                "the watchdog has to dump every rank before the collective timeout aborts the job"
            )


def ncclx_config_from(value: Any) -> NcclxConfig:
    """Turn ``None``, a mapping, a DictConfig or an ``NcclxConfig`` into a validated ``NcclxConfig``."""
    if value is None:
        return NcclxConfig()
    if isinstance(value, NcclxConfig):
        return value
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(value, DictConfig):
            value = OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if isinstance(value, Mapping):
        unknown = set(value) - {"backend", "flight_recorder", "timeouts", "watchdog", "straggler", "alerts",
                                 "metrics"}
        if unknown:
            raise ConfigError(f"ncclx has no key(s) {sorted(unknown)}; expected backend, flight_recorder, timeouts, "
                              "watchdog, straggler, alerts, metrics")
        try:
            return NcclxConfig(**dict(value))
        except TypeError as err:
            raise ConfigError(f"ncclx: {err}") from None
    raise ConfigError(f"ncclx config must be a mapping or NcclxConfig, got {type(value).__name__}")
