-- Semaphore: give back the caller's permit, and announce it so a waiter of every client
-- tries again (see acquire.lua for the key's layout).
--
-- KEYS[1]  lock key (the semaphore's sorted set: permit owners scored by expiry in ms on the
--          server clock, and the '#permits:N' marker scored +inf)
-- ARGV[1]  owner token
-- ARGV[2]  how the store announces: 'PUBLISH', or 'SPUBLISH' on Cluster (sharded pub/sub); ''
--          announces nothing (a Redlock try's give-back)
-- ARGV[3]  the lock's release channel (an argument: lock_key.lua)
--
-- Returns 1 when the caller held a permit with a live lease and no longer does, 0 when it did
-- not hold one any more (expired, purged, force-unlocked, or released already). Safe to
-- repeat: it only ever removes the caller's own member, so it never frees more than it took.
-- The key's expiry is brought down to the longest remaining permit's lease, and the key is
-- deleted when only the marker is left.

-- pcall: while a writer holds the key it is a string, and ZSCORE fails on it.
local score = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(score) ~= 'string' then
  return 0
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local last = redis.call('ZREVRANGEBYSCORE', KEYS[1], '(+inf', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
if #last > 0 then
  redis.call('PEXPIREAT', KEYS[1], last[2])
else
  redis.call('DEL', KEYS[1])
end
-- One announcement per freed permit; a user without channel permissions (Redis 7 ACLs) only
-- loses the wake-up.
if ARGV[2] ~= '' then
  redis.pcall(ARGV[2], ARGV[3], 's')
end
if tonumber(score) > now_ms then
  return 1
end
return 0
