-- Read side: join the readers of a lock if no writer holds it and none is waiting, in one
-- round trip. While readers hold the lock, its key is a sorted set of their owner tokens,
-- each scored by when its lease ends on the server's clock, so one reader's release, crash or
-- expiry never frees another; the key itself expires with the last reader's lease. A writer's
-- SET NX fails on it like on a writer's key, so taking the write lock costs no more than when
-- there were no readers at all.
--
-- KEYS[1]  lock key (a string while a writer holds it, the readers' sorted set while readers do)
-- KEYS[2]  fencing counter (read, never written), only where tokens come from a counter
--          (Redlock); see write/acquire.lua
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  the writer-waiting mark's key (an argument, not a key: lock_key.lua)
-- (all keys share one hash tag)
--
-- Returns {1, token} when granted, where token is the latest write token while the key's
-- fencing counter lives, else the server clock in microseconds: either way at least every
-- earlier write token and below every later one (see write/acquire.lua for the clock
-- assumption). And {0, ms} when a writer holds the lock or waits for it, or semaphore permits
-- hold the key: ms is how long that lasts at most (-1: the writer's key has no expiry). Expired readers are purged on every call.
-- A key that holds anything but a lock, or a counter that holds anything but a number, is a
-- NOTALOCK error, and a counter of 2^53 or more a FENCETOOLARGE error; either way nothing is
-- purged or written (lock_key.lua).
--
-- A call whose owner is already a reader is the same try sent again after its reply was lost:
-- it is granted again, with the lease starting from now.

local held = lock_held(KEYS[1])
-- Before anything is purged or written, and whoever holds the lock: a counter of another
-- application's is NOTALOCK, one of 2^53 or more FENCETOOLARGE (lock_key.lua).
local last = KEYS[2] and fencing_counter(KEYS[2])
if held == 'writer' or held == 'permits' then
  -- A writer, or a semaphore's permits, which keep readers out as a writer does.
  return {0, redis.call('PTTL', KEYS[1])}
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local lease = tonumber(ARGV[2])
local member = false
if held == 'readers' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
  member = redis.call('ZSCORE', KEYS[1], ARGV[1])
end
if not member then
  local waiting = writer_waiting(ARGV[3])
  if waiting ~= -2 then
    return {0, waiting}
  end
end
redis.call('ZADD', KEYS[1], now_ms + lease, ARGV[1])
-- The key lives as long as its longest reader's lease.
if redis.call('PTTL', KEYS[1]) < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
if last then
  return {1, last}
end
return {1, tonumber(now[1]) * 1000000 + tonumber(now[2])}
