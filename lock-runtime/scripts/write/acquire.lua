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
--          single node, Sentinel, Cluster), '0' (no token: efficiency mode), or the counter's
--          time to live in milliseconds (Redlock: the clock, or the counter + 1 when the
--          counter is not below it, see below)
-- ARGV[4]  time to live of the writer-waiting mark in milliseconds (0: no mark; a writer's
--          last try, after which it will not try again)
-- ARGV[5]  '1' when an earlier try of this request found the lock held (and may have set the
--          mark): a grant deletes the mark. A first try does not look at it.
-- ARGV[6]  the writer-waiting mark's key: while it lives, no new reader enters (an argument,
--          not a key: lock_key.lua)
-- (all keys share one hash tag)
--
-- Returns {1, token} when granted ({1, -1} without a fencing token), {0, ms} when held: ms is
-- how long the current holders keep it at most (the key's PTTL, which for readers is the last reader's expiry; -1 when the key
-- has no expiry, -2 when it vanished meanwhile). A try that finds the lock held sets the
-- writer-waiting mark, so that readers cannot starve writers. An uncontended grant (a first
-- try) touches neither the readers nor the mark: it costs what it would without readers.
-- A counter that is not a number is a NOTALOCK error, and then no grant is left behind. A key that holds
-- anything but a lock is a NOTALOCK error, and nothing is written (lock_key.lua); a free key
-- costs no such check.
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
-- Tokens from the counter (Redlock, whose quorums compare tokens of different masters and
-- raise the counters of a majority, see redlock.rs): the clock, or one more than the counter
-- when the counter is not below the clock; the counter keeps the last token for ARGV[3] ms
-- (one lease), so no key is left behind for long. Once it has expired, the clock has passed
-- its value by that time to live (Redis expires keys on the same clock).

if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- Held (by a writer, readers or permits), or not a lock at all (NOTALOCK). A writer, the
  -- most common holder, is read with one GET; anything else goes through lock_held.
  local holder = redis.pcall('GET', KEYS[1])
  if not is_owner(holder) then
    local _
    _, holder = lock_held(KEYS[1])
  end
  if holder ~= ARGV[1] then
    if ARGV[4] ~= '0' then
      mark_writer_waiting(ARGV[6], ARGV[4])
    end
    return {0, redis.call('PTTL', KEYS[1])}
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
-- Scripts replicate their effects (default since Redis 5), so reading TIME is allowed.
local now = redis.call('TIME')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
if ARGV[3] == 'clock' then
  return {1, token}
end
-- A counter that is not one (another application's data) is NOTALOCK, and the grant is
-- undone first (scripts are not rolled back): nothing is left written.
local foreign = foreign_counter(KEYS[2])
if foreign then
  redis.call('DEL', KEYS[1])
  not_a_lock(KEYS[2], foreign)
end
-- One write: the clock goes in, and the counter it replaces is compared afterwards. ('%d':
-- Lua would write a number this large in exponent notation.)
local last = tonumber(redis.call('SET', KEYS[2], string.format('%d', token), 'PX', ARGV[3], 'GET'))
if last and last >= token then
  token = last + 1
  redis.call('SET', KEYS[2], string.format('%d', token), 'PX', ARGV[3])
end
return {1, token}
