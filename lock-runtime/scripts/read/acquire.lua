-- Read side: join the readers of a lock if no writer holds it and none is waiting, in one
-- round trip. Every reader is a member of its own in the readers set, scored by when its lease
-- ends on the server's clock, so one reader's release, crash or expiry never frees another.
--
-- KEYS[1]  lock key (the writer's; a reader only looks at it)
-- KEYS[2]  fencing counter (read, never incremented)
-- KEYS[3]  readers: sorted set of reader owner tokens, scored by expiry (ms, server clock)
-- KEYS[4]  writer-waiting mark
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds
-- (all keys share one hash tag)
--
-- Returns {1, token} when granted, where token is the latest write token (0 when the counter
-- is gone), and {0, ms} when a writer holds the lock or waits for it: ms is how long that lasts
-- at most (-1: the writer's key has no expiry). Expired readers are purged on every call.
--
-- A call whose owner is already a reader is the same try sent again after its reply was lost:
-- it is granted again, with the lease starting from now.

local writer = redis.call('PTTL', KEYS[1])
if writer ~= -2 then
  return {0, writer}
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms)
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  local waiting = redis.call('PTTL', KEYS[4])
  if waiting ~= -2 then
    return {0, waiting}
  end
end
redis.call('ZADD', KEYS[3], now_ms + lease, ARGV[1])
-- The set outlives every member's lease, and no longer than the last of them.
if redis.call('PTTL', KEYS[3]) < lease then
  redis.call('PEXPIRE', KEYS[3], lease)
end
local token = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
return {1, token}
