"""admission — shared admission for LLM agent rounds, on Redis.

The public surface (everything else is internal):
"""
from .classify import outcome_of
from .base import current_round
from .client import Admission, Round
from .mesh import Mesh
from .codes import ADMIT_REASONS, FENCE_REASONS, REFUSE_REASONS, UNAVAILABLE, Status
from .core import Bound, Decision, Progress, Released, Retried, Seat, Taken, Usage
from .errors import (AdmissionError, BadArgument, BadName, NoPolicy, NotYourSeat, PolicyError,
                     RoundInProgress, ScriptError, StaleVersion, Unavailable, UnknownLane, UnknownPool,
                     UnknownSeat, WaitTimeout)
from .urgency import urgency

from .aio import AsyncAdmission
from ._mesh_async import AsyncMesh

__all__ = [
    "Admission", "AsyncAdmission", "Mesh", "AsyncMesh", "Round", "Decision", "Seat", "Progress", "Released", "Retried", "Bound", "Status",
    "ADMIT_REASONS", "REFUSE_REASONS", "FENCE_REASONS", "UNAVAILABLE", "urgency", "outcome_of",
    "AdmissionError", "BadArgument", "BadName", "UnknownLane", "UnknownPool", "UnknownSeat",
    "NotYourSeat", "NoPolicy", "PolicyError", "StaleVersion", "WaitTimeout", "Unavailable",
    "RoundInProgress", "ScriptError", "current_round", "Usage", "Taken",
]
