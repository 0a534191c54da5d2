"""One exception tree for traylm. Every message says what happened and what to do next."""

from __future__ import annotations


class TraylmError(Exception):
    """Root of every error traylm raises on purpose.

    ``code`` is a stable machine-readable name (shown in the control API and events);
    the message is for people and ends with what to do.
    """

    code = "traylm_error"
    http_status = 500

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.code


class ConfigError(TraylmError):
    """A setting or profile is invalid. The message names the field and a valid value."""

    code = "config_invalid"
    http_status = 400


class ProfileNotFound(ConfigError):
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


class EngineNotFound(EngineError):
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
    code = "daemon_version_mismatch"
    http_status = 409


class ControlAPIError(TraylmError):
    """The control API answered with an error; ``code`` and ``http_status`` come from it."""

    def __init__(self, message: str, *, code: str, http_status: int) -> None:
        super().__init__(message, code=code)
        self.http_status = http_status


class GPUError(TraylmError):
    code = "gpu_error"


class HubError(TraylmError):
    code = "hub_error"


class ChatNotFound(TraylmError):
    """desktop (issue 6): a stored conversation id that does not exist (deleted elsewhere)."""

    code = "chat_not_found"
    http_status = 404
