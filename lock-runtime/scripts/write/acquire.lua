-- Write (exclusive) side: take the lock if nobody holds it, and hand out the next fencing
-- token, in one round trip.
--
-- KEYS[1]  lock key: a string holding the writer's owner token while a writer holds it, a
--          sorted set of reader owner tokens while readers hold it (see read/acquire.lua)
-- KEYS[2]  fencing counter, only with counter tokens (Redlock): a key a call does not use is
--          not passed, since on Cluster a key that does not exist makes a call during a slot
--          migration fail (TRYAGAIN; lock_key.lua)
-- ARGV[1]  owner token (random, 128 bits)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  where the fencing token comes from: 'clock' (the server clock in microseconds;
--          single node, Sentinel, Cluster), '0' (no token: efficiency mode), or 'T:ms' with
--          counter tokens (Redlock): the proposed token T and the counter's time to live in
--          ms beyond it, see below
-- ARGV[4]  time to live of the writer-waiting mark in milliseconds (0: no mark; a writer's
--          last try, after which it will not try again)
-- ARGV[5]  '1' when an earlier try of this request found the lock held (and may have set the
--          mark): a grant deletes the mark. A first try does not look at it.
-- ARGV[6]  the writer-waiting mark's key: while it lives, no new reader enters (an argument,
--          not a key: lock_key.lua)
-- (all keys share one hash tag)
--
-- Returns {1, token} when granted ({1, -1} without a fencing token), {0, ms} when held: ms is
-- how long the current holders keep it at most (the key's PTTL, which for readers is the last
-- reader's expiry; -1 when the key has no expiry, -2 when it vanished meanwhile), and with
-- counter tokens {2, hint, clock} when the proposed token is too low (below). A try that
-- finds the lock held sets the writer-waiting mark, so that readers cannot starve writers. An
-- uncontended grant (a first try) touches neither the readers nor the mark: it costs what it
-- would without readers. A key that holds anything but a lock, or a counter that is not a
-- number, is a NOTALOCK error, and nothing is written (lock_key.lua); a free key costs no
-- such check.
--
-- A call whose owner already holds the lock is the same try sent again after its reply was
-- lost (every try has an owner token of its own): it is granted as if new — the lease starts
-- again from now and a fresh token is handed out — so no grant is ever handed out with less
-- lease than it asked for.
--
-- Tokens from the clock: two grants of one key are at least a round trip apart (a release
-- or a clean-up is sent only once the grant's reply came or timed out; an expiry takes a
-- lease), so the clock has moved on between them; this assumes the server clock does not step back, also across a restart without
-- persistence or a failover (README, "Guarantees").
--
-- Tokens from the counter (Redlock, whose masters must agree on one token per grant, see
-- redlock.rs): the caller proposes T, the same to every master of a round. Before anything
-- is written, a master refuses T with {2, hint, clock} when its live counter is not below T
-- or its clock has passed T (hint: the least token it would take now, one above both; clock:
-- its clock in microseconds, for the caller to learn how far its own lags) — unless the lock
-- is held by someone else, which is the ordinary refusal, or is ours with the counter at T
-- (this very try sent again). A grant sets the counter to T until the clock has passed T and
-- one more ttl (lock_key.lua's set_counter): a later T' is granted here only above T while
-- the counter lives, and only at or above a clock past T once it has lapsed. No counter of
-- 2^53 or more is ever written (tokens are doubles here, exact only below it): a proposal
-- there, or a refusal whose hint would point there (a counter at 2^53 - 1), is a
-- FENCETOOLARGE error instead, with nothing written (lock_key.lua).

-- The refusal of a try that finds the lock held by another owner.
local function held()
  if ARGV[4] ~= '0' then
    mark_writer_waiting(ARGV[6], ARGV[4])
  end
  return {0, redis.call('PTTL', KEYS[1])}
end

local proposed, counter_ttl, clock
if ARGV[3] ~= '0' and ARGV[3] ~= 'clock' then
  local token, ttl = string.match(ARGV[3], '^(%d+):(%d+)$')
  proposed, counter_ttl = tonumber(token), tonumber(ttl)
  local last = fencing_counter(KEYS[2])
  writable_token(KEYS[2], proposed, token)
  -- Scripts replicate their effects (default since Redis 5), so reading TIME is allowed.
  local now = redis.call('TIME')
  clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local refusal = too_low(proposed, last, clock)
  if refusal then
    local _, holder = lock_held(KEYS[1])
    if holder and holder ~= ARGV[1] then
      return held()
    elseif not (holder == ARGV[1] and last == proposed) then
      return hint_below_limit(KEYS[2], refusal)
    end
  end
end

if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- Held (by a writer, readers or permits), or not a lock at all (NOTALOCK). A writer, the
  -- most common holder, is read with one GET; anything else goes through lock_held.
  local holder = redis.pcall('GET', KEYS[1])
  if not is_owner(holder) then
    local _
    _, holder = lock_held(KEYS[1])
  end
  if holder ~= ARGV[1] then
    return held()
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if ARGV[5] == '1' then
  -- This writer waited: its mark has done its job.
  beside('DEL', ARGV[6])
end
if ARGV[3] == '0' then
  return {1, -1}
end
if proposed then
  set_counter(KEYS[2], proposed, clock, counter_ttl)
  return {1, proposed}
end
local now = redis.call('TIME')
return {1, tonumber(now[1]) * 1000000 + tonumber(now[2])}
