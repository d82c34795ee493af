-- Reply codes shared by every script. This file is the one source: admission/codes.py mirrors it
-- and tests/test_codes.py checks the two agree (by parsing this file and by asking a server).
-- Status codes are the first element of every reply array.

local STATUS = {
  REFUSED = 0,          -- admit: the round may not start now (reason says why)
  ADMITTED = 1,         -- admit: a seat is held (reason says by which rule)
  RELEASED = 2,         -- release: the seat is gone and its outcome counted
  ALREADY_RELEASED = 3, -- release: a retry of a release that already counted; nothing changed
  EXPIRED = 4,          -- release: the seat's lease had expired; outcome counted, counts already healed
  REPORTED = 5,         -- report: the signal was applied (or held once-per-burst)
  ALREADY_REPORTED = 6, -- report: this seat already reported a load signal; nothing changed
  OK = 7,               -- heartbeat, tick, apply-config, plan, census, budget, provider, rollover
  CHARGED = 8,          -- charge: the cost was booked to the ledger
  ALREADY_CHARGED = 9,  -- charge: this charge key was booked before; nothing changed
  TAKEN = 10,           -- take: the call's request and tokens are debited from its scope
  ALREADY_TAKEN = 11,   -- take: this call key took before; nothing changed
  SEAT_LOST = 12,       -- take: no such seat any more (released or swept); nothing written
}
-- Error prefixes: every error reply starts with one of these words, then a readable message.
local ERR = {
  BAD_ARG = 'ADM_BAD_ARG',           -- malformed argument (missing, wrong type, NaN, negative)
  BAD_NAME = 'ADM_BAD_NAME',         -- a name with braces, spaces, control characters or too long
  UNKNOWN_LANE = 'ADM_UNKNOWN_LANE', -- lane not in the policy
  UNKNOWN_POOL = 'ADM_UNKNOWN_POOL', -- pool not in the catalog
  UNKNOWN_SEAT = 'ADM_UNKNOWN_SEAT', -- no such seat (never admitted, or long gone)
  NOT_YOUR_SEAT = 'ADM_NOT_YOUR_SEAT', -- the seat belongs to another pod or another admission
  NO_CONFIG = 'ADM_NO_CONFIG',       -- no policy applied to this mesh yet
  BAD_POLICY = 'ADM_BAD_POLICY',     -- apply-config got a malformed policy
  STALE_VERSION = 'ADM_STALE_VERSION', -- apply-config lost a compare-and-set on the version
  UNKNOWN_PROVIDER = 'ADM_UNKNOWN_PROVIDER', -- provider not declared in the policy
}

return {STATUS = STATUS, ERR = ERR}
