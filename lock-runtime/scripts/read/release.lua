-- Read side: leave the readers of a lock, and when the last one leaves while a writer waits,
-- wake a writer.
--
-- KEYS[1]  lock key (the readers' sorted set of owner tokens scored by expiry, ms, server clock)
-- ARGV[1]  owner token
-- ARGV[2]  how the store announces: 'PUBLISH', or 'SPUBLISH' on Cluster (sharded pub/sub); ''
--          announces nothing (a Redlock try's give-back)
-- ARGV[3]  writer-waiting mark's key, ARGV[4] the lock's release channel (arguments, not
--          keys: lock_key.lua)
--
-- Returns 1 when the caller was a reader with a live lease and no longer is, 0 when it was not
-- a reader any more (expired, purged, or released already). Safe to repeat. The key's expiry
-- is brought down to the longest remaining reader's lease; Redis deletes the key with its last
-- member, which frees the lock for writers. It changes the key only when the caller's own owner
-- token is in it, so never a key that holds data it did not write.

-- pcall: while a writer holds the lock the key is a string, and ZSCORE fails on it.
local score = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(score) ~= 'string' then
  return 0
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #last > 0 then
  redis.call('PEXPIREAT', KEYS[1], last[2])
elseif ARGV[2] ~= '' and writer_waiting(ARGV[3]) ~= -2 then
  -- A user without channel permissions (Redis 7 ACLs) only loses the wake-up.
  redis.pcall(ARGV[2], ARGV[4], 'w')
end
if tonumber(score) > now_ms then
  return 1
end
return 0
