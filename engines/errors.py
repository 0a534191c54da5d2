"""One exception tree for traylm. Every message says what happened and what to do next."""

from __future__ import annotations

QUOTE_CHARS = 80
"""The most characters of a client's text an error message quotes (then "…")."""


def quoted(text: object, limit_chars: int = QUOTE_CHARS) -> str:
    """``text`` as an error message quotes what a client sent (a name, a value): its first
    ``limit_chars`` characters in quotes, then "…" when there was more, so a 3 MB name gives a
    short message; text that is not valid Unicode (a lone surrogate) is shown escaped."""
    if isinstance(text, str):
        shown, more = repr(text[:limit_chars]), len(text) > limit_chars
    else:  # a number, a list: as Python writes it, cut the same way
        written = repr(text)
        shown, more = written[:limit_chars], len(written) > limit_chars
    return shown.encode("utf-8", "backslashreplace").decode() + ("…" if more else "")


class TraylmError(Exception):
    """Root of every error traylm raises on purpose.

    ``code`` is a stable machine-readable name (shown in the control API and events);
    the message is for people and ends with what to do. ``brief``: the same in a few words,
    for a menu or a greyed entry ("needs an NVIDIA GPU (this computer has none)"); the message
    when not given.
    """

    code = "traylm_error"
    http_status = 500

    def __init__(self, message: str, *, code: str | None = None, brief: str = "") -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.brief = brief or message

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.code


class ConfigError(TraylmError):
    """A setting or profile is invalid. The message names the field and a valid value."""

    code = "config_invalid"
    http_status = 400


class BatchNotFound(TraylmError):
    """No batch by that id (`traylm batches ls` lists them)."""

    code = "batch_not_found"
    http_status = 404


class ProfileNotFound(ConfigError):
    """No profile by that name (`traylm profiles` lists them)."""

    code = "profile_not_found"
    http_status = 404


class EngineEnvError(TraylmError):
    """An engine environment is missing, broken, or cannot be installed."""

    code = "engine_env"
    http_status = 409


class UnknownFlagError(ConfigError):
    """An extra engine flag is not accepted by the installed engine version."""

    code = "unknown_flag"


class EngineError(TraylmError):
    """An engine failed to start, crashed, or is not in a state that allows the operation."""

    code = "engine_error"
    http_status = 409


class ModelUnavailable(TraylmError):
    """A request's model cannot be served now: unknown (404), not loaded with JIT off (404), no
    room on the GPUs (503), or its load failed (503, with the engine's diagnosis). The gateway
    answers it in the OpenAI error shape; ``retry_after_s`` is sent as Retry-After when set and
    ``retry`` says whether a client should retry at all (``x-should-retry``)."""

    code = "model_unavailable"
    http_status = 503

    def __init__(
        self,
        message: str,
        *,
        code: str,
        http_status: int = 503,
        retry_after_s: int | None = None,
        retry: bool = False,
    ) -> None:
        super().__init__(message, code=code)
        self.http_status = http_status
        self.retry_after_s = retry_after_s
        self.retry = retry


class EngineNotFound(EngineError):
    """No engine by that id is running or known (`traylm status` lists them)."""

    code = "engine_not_found"
    http_status = 404


class PortInUseError(TraylmError):
    """A port traylm needs is held by another process."""

    code = "port_in_use"
    http_status = 409


class DaemonUnavailable(TraylmError):
    """The traylm daemon is not running or does not answer."""

    code = "daemon_unavailable"
    http_status = 503


class DaemonVersionMismatch(TraylmError):
    """The daemon that answers is another traylm version than this command; restart it."""

    code = "daemon_version_mismatch"
    http_status = 409


class ControlAPIError(TraylmError):
    """The control API answered with an error; ``code`` and ``http_status`` come from it."""

    def __init__(self, message: str, *, code: str, http_status: int) -> None:
        super().__init__(message, code=code)
        self.http_status = http_status


class DiskFull(TraylmError):
    """The disk holding traylm's data folder is full: traylm.db could not be written. Nothing
    was half-written; the message names the folder and what to free. Usage rows and chat
    replies are kept in memory meanwhile and written once there is room (HTTP 507)."""

    code = "disk_full"
    http_status = 507


class GPUError(TraylmError):
    """Root of the GPU feature's errors (telemetry, fans, power limits)."""

    code = "gpu_error"


class GPUUnavailable(GPUError):
    """No NVIDIA driver, library or GPU: telemetry retries with backoff; the rest works."""

    code = "gpu_unavailable"
    http_status = 503


class GPULost(GPUError):
    """A GPU fell off the bus (NVML GpuIsLost): traylm stops controlling it; reboot needed."""

    code = "gpu_lost"
    http_status = 503


class GPUPermissionDenied(GPUError):
    """A write NVML refused (no root): fan and power control go through traylm-gpud."""

    code = "gpu_no_permission"
    http_status = 403


class GPUNotSupported(GPUError):
    """The GPU or its driver does not offer this control (a fan or power call NVML refuses)."""

    code = "gpu_not_supported"
    http_status = 409


class GPUNotFound(GPUError):
    """No GPU by that index or UUID (`traylm gpus` lists them)."""

    code = "gpu_not_found"
    http_status = 404


class HelperUnavailable(GPUError):
    """traylm-gpud does not answer: fan curves and power limits are read-only."""

    code = "helper_unavailable"
    http_status = 409


class HelperRefused(GPUError):
    """traylm-gpud refused a request (bad value, rate limit); the message says why."""

    code = "helper_refused"
    http_status = 400


class HubError(TraylmError):
    """Root of the model hub's errors (search, fit, downloads, library)."""

    code = "hub_error"


# the hub feature's errors: subclasses of HubError


class InvalidName(HubError):
    """A repo id, revision or file name that could escape a folder or is not a Hub name."""

    code = "invalid_name"
    http_status = 400


class ModelNotFound(HubError):
    """No such model (or revision) on the Hub, or not visible without access."""

    code = "model_not_found"
    http_status = 404


class HubAccessDenied(HubError):
    """A gated or private model refused us (no token, a withheld token, or no access)."""

    code = "gated"
    http_status = 403


class HubUnavailable(HubError):
    """The Hub cannot be reached or answers with server errors."""

    code = "hub_unavailable"
    http_status = 503


class NoSafetensors(HubError):
    """The repo has no weights traylm will fetch (pickles only, GGUF, no config.json)."""

    code = "no_safetensors"
    http_status = 422


class DiskSpaceError(HubError):
    """Not enough free disk for a download; the message says how much it needs."""

    code = "disk_full"
    http_status = 507


class DownloadNotFound(HubError):
    """No download by that id (`traylm models downloads` lists them)."""

    code = "download_not_found"
    http_status = 404


class ModelInUse(HubError):
    """A model an engine is serving cannot be deleted."""

    code = "model_in_use"
    http_status = 409


class BenchError(TraylmError):
    """A benchmark cannot start or failed (one already running, the model not served, every
    warm-up request refused); the message says what to do."""

    code = "bench_error"
    http_status = 409


class ChatNotFound(TraylmError):
    """A stored conversation id that does not exist (deleted elsewhere)."""

    code = "chat_not_found"
    http_status = 404


class PeerError(TraylmError):
    """Pairing or talking to a paired box failed; the message names the box and the fix."""

    code = "peer_error"
    http_status = 409


class PairingRefused(PeerError):
    """A pairing code that is wrong, used, expired, or no pairing in progress."""

    code = "pairing_refused"
    http_status = 403


class PeerNotFound(PeerError):
    """No paired box by that name (`traylm peers` lists them)."""

    code = "peer_not_found"
    http_status = 404


class PeerUnreachable(PeerError):
    """A paired box does not answer; the message names it and why."""

    code = "peer_unreachable"
    http_status = 502


class PreflightFailed(PeerError):
    """A model across boxes cannot start: a box differs (engine, model bytes), cannot be
    reached on the rendezvous port, or its clock is far off; each named with its fix."""

    code = "preflight_failed"


class TuneError(TraylmError):
    """The tuner cannot start or stopped (a model no candidate fits, a budget too small for two
    repetitions, the profile itself failing to run); the message says what to do."""

    code = "tune_error"
    http_status = 409


class UpgradeError(TraylmError):
    """A guarded engine upgrade cannot start (another runs, nothing to compare on, no newer
    version could be looked up); the message says what to do."""

    code = "upgrade_error"
    http_status = 409
