"""The service's exception tree; the API layer maps each class to one HTTP status.

ServiceError                  base; `detail` says what was wrong and what to do
├── InvalidRequest            422  malformed or out-of-range input (nothing applied)
├── PayloadTooLarge           413  body or list beyond the configured limits
├── NotFound                  404  unknown dataset
│   └── DatasetGone                the dataset incarnation a write named was deleted or replaced
├── Conflict                  409  name taken with another spec; step already closed
├── Unavailable               503  the store cannot be reached (retry later)
└── InsufficientMemory        507  a dataset would not fit in this process's memory budget
"""

from __future__ import annotations


class ServiceError(Exception):
    status_code = 500

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class InvalidRequest(ServiceError):
    status_code = 422


class PayloadTooLarge(ServiceError):
    status_code = 413


class NotFound(ServiceError):
    status_code = 404


class DatasetGone(NotFound):
    """The store refused a write because the dataset incarnation (uid) it named is gone: deleted, or
    deleted and created again, or replaced by an import, while the request was in flight. The engine
    looks at the stored spec before it answers (a request sent with an outdated spec runs again)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"dataset {name!r} does not exist (it may have been deleted)")
        self.name = name


class Conflict(ServiceError):
    status_code = 409


class Unavailable(ServiceError):
    status_code = 503


class InsufficientMemory(ServiceError):
    """507 Insufficient Storage: the dataset this request needs in memory does not fit in the process's
    memory budget (SELECTOR_MEMORY_BUDGET_BYTES), or an allocation failed; nothing was changed."""

    status_code = 507
