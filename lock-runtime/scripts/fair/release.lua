-- Fair (queued) exclusive lock: give back the caller's grant if it still holds it, take its
-- waiter out of the queue (a waiter that times out or is cancelled leaves this way too, with
-- the owner token of its last try), and wake the queue's head when the lock is free.
--
-- KEYS[1]  lock key
-- KEYS[2]  the lock's release channel
-- KEYS[3]  the queue (see acquire.lua)
-- KEYS[4]  the queue's deadlines (see acquire.lua)
-- ARGV[1]  owner token; its first 24 characters are the waiter id
-- ARGV[2]  how the store announces: 'PUBLISH', or 'SPUBLISH' on Cluster (sharded pub/sub)
--
-- Returns 1 when the lock was the caller's and is now free, 0 when it was not (expired, taken
-- over, deleted, or the caller was only waiting). Safe to repeat.
--
-- The wake-up names the head ('f:' and its waiter id): each client wakes only that waiter, if
-- it is one of its own. Waiters whose deadline has passed are dropped first, so a dead head is
-- not the one woken. With nobody queued, 'w' wakes the key's other waiters as a write release
-- does.

local waiter = string.sub(ARGV[1], 1, 24)
redis.call('ZREM', KEYS[3], waiter)
redis.call('ZREM', KEYS[4], waiter)
local released = 0
-- pcall: while readers hold the lock the key is a sorted set, and GET fails on it.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  released = 1
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms)
  for _, gone in ipairs(dead) do
    redis.call('ZREM', KEYS[3], gone)
    redis.call('ZREM', KEYS[4], gone)
  end
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  -- A user without channel permissions (Redis 7 ACLs) only loses the wake-up.
  if head then
    redis.pcall(ARGV[2], KEYS[2], 'f:' .. head)
  elseif released == 1 then
    redis.pcall(ARGV[2], KEYS[2], 'w')
  end
end
return released
