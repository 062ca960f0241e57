"""The exceptions nvfp4moe raises: each carries the library's status and message."""

from __future__ import annotations

__all__ = [
    "Error", "InvalidArgumentError", "ShapeError", "UnsupportedError", "NotFoundError", "FileError",
    "FormatError", "OutOfMemoryError", "CudaError", "BufferTooSmallError", "InternalError",
    "BackendError", "NoBackendError", "LibraryNotFoundError",
]


class Error(Exception):
    """A failure reported by libnvfp4moe.

    ``status`` is the library's status code (``nvfp4moe_status``), ``status_name`` its name
    ("invalid argument", ...), ``message`` the library's message, which names the offending
    field, tensor or file. ``report`` is the oracle's report (a :class:`nvfp4moe.Selection`) when
    the failure is the oracle's decision, else None.
    """

    def __init__(self, message: str, status: int = 0, status_name: str = "", report=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.status_name = status_name
        self.report = report


class InvalidArgumentError(Error, ValueError):
    """A bad value: a config field, a tensor's shape or dtype, an argument (status 1)."""


class ShapeError(InvalidArgumentError):
    """Sizes that do not fit the format (status 2)."""


class UnsupportedError(Error, NotImplementedError):
    """Valid, but this build or this layer API cannot do it (status 3)."""


class NotFoundError(Error, ValueError, FileNotFoundError):
    """An unknown name, or a missing file or tensor (status 4)."""


class FileError(Error, OSError):
    """The operating system refused a read or a write (status 5)."""


class FormatError(Error, ValueError):
    """A malformed file: header, JSON, dtype, offsets (status 6)."""


class OutOfMemoryError(Error, MemoryError):
    """Out of memory (status 7)."""


class CudaError(Error, RuntimeError):
    """The CUDA runtime reported an error (status 8)."""


class BufferTooSmallError(InvalidArgumentError):
    """A buffer (a batched expert-parallel capacity, a workspace) is too small (status 9)."""


class InternalError(Error, RuntimeError):
    """A bug in nvfp4moe: please report it (status 10)."""


class BackendError(Error, ValueError):
    """vLLM's ValueError: the requested moe_backend is unknown or cannot run the deployment."""


class NoBackendError(Error, NotImplementedError):
    """vLLM's NotImplementedError: no NvFp4 MoE backend supports the deployment configuration."""


class LibraryNotFoundError(OSError):
    """libnvfp4moe.so could not be found or loaded (the message lists where it was looked for)."""


_BY_STATUS = {
    1: InvalidArgumentError, 2: ShapeError, 3: UnsupportedError, 4: NotFoundError, 5: FileError,
    6: FormatError, 7: OutOfMemoryError, 8: CudaError, 9: BufferTooSmallError, 10: InternalError,
}


def error_for(status: int, status_name: str, message: str, report=None) -> Error:
    """The exception for a failing call: the oracle's ValueError / NotImplementedError when the
    report holds one, otherwise the class of the status."""
    if report is not None and report.get("error"):
        kind = report["error"].get("kind")
        if kind == "NotImplementedError":
            return NoBackendError(message, status, status_name, report)
        if kind == "ValueError":
            return BackendError(message, status, status_name, report)
    return _BY_STATUS.get(status, Error)(message, status, status_name, report)
