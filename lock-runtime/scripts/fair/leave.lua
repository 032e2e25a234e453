-- Leave a fair (queued) exclusive lock: give back the caller's grant if it still holds it, take its
-- waiter out of the queue (a waiter that times out or is cancelled leaves this way too, with
-- the owner token of its last try), and wake the queue's head when the lock is free.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token; its first 24 characters are the waiter id
-- ARGV[2]  how the store announces: 'PUBLISH', or 'SPUBLISH' on Cluster (sharded pub/sub)
-- ARGV[3]  the lock's release channel
-- ARGV[4]  the queue (see acquire.lua)
-- ARGV[5]  the queue's deadlines (see acquire.lua)
-- (arguments, not keys: lock_key.lua; while the queue lives on the other node of a Cluster
-- slot migration, only the lock is given back, and the waiter leaves the queue by its
-- deadline)
--
-- Returns 1 when the lock was the caller's and is now free, 0 when it was not (expired, taken
-- over, deleted, or the caller was only waiting). Safe to repeat.
--
-- The wake-up names the head ('f:' and its waiter id): each client wakes only that waiter, if
-- it is one of its own. Waiters whose deadline has passed are dropped first, so a dead head is
-- not the one woken. With nobody queued, 'w' wakes the key's other waiters as a write release
-- does.

local waiter = string.sub(ARGV[1], 1, 24)
local channel, queue, deadlines = ARGV[3], ARGV[4], ARGV[5]
-- Lenient: whatever the queue's keys hold, the caller's own grant is still given back.
local queued = own_queue(queue, true) and own_queue(deadlines, true)
if queued then
  redis.call('ZREM', queue, waiter)
  redis.call('ZREM', deadlines, waiter)
end
local released = 0
-- pcall: while readers hold the lock the key is a sorted set, and GET fails on it.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  released = 1
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  local head = nil
  if queued then
    local now = redis.call('TIME')
    local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    local dead = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now_ms)
    for _, gone in ipairs(dead) do
      redis.call('ZREM', queue, gone)
      redis.call('ZREM', deadlines, gone)
    end
    head = redis.call('ZRANGE', queue, 0, 0)[1]
  end
  -- A user without channel permissions (Redis 7 ACLs) only loses the wake-up.
  if head then
    redis.pcall(ARGV[2], channel, 'f:' .. head)
  elseif released == 1 then
    redis.pcall(ARGV[2], channel, 'w')
  end
end
return released
