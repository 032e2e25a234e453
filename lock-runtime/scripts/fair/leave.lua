-- Leave a fair (queued) exclusive lock: give back the caller's grant if it still holds it, take its
-- waiter out of the queue (a waiter that times out or is cancelled leaves this way too, with
-- the owner token of its last try), and wake the queue's head when the lock is free.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token; its first 24 characters are the waiter id
-- ARGV[2]  how the store announces: 'PUBLISH', or 'SPUBLISH' on Cluster (sharded pub/sub); ''
--          announces nothing (a Redlock try's give-back)
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
-- A grant left the queue when it was made (acquire.lua), so giving it back reads the queue
-- only for its head; a waiter that gives up is taken out of both keys. The wake-up names the
-- head ('f:' and its waiter id): each client wakes only that waiter, if it is one of its own.
-- Dead waiters are not looked for here: a dead head, woken in vain, is dropped by the next try
-- of a waiter behind it once its deadline has passed, which then wakes the new head
-- (acquire.lua). With nobody queued, 'w' wakes the key's other waiters as a write release
-- does.

local waiter = string.sub(ARGV[1], 1, 24)
local channel, queue, deadlines = ARGV[3], ARGV[4], ARGV[5]
local released = 0
-- pcall: while readers hold the lock the key is a sorted set, and GET fails on it.
local held = redis.pcall('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('DEL', KEYS[1])
  released = 1
elseif own_queue(queue, true) and own_queue(deadlines, true) then
  -- Lenient: whatever the queue's keys hold, the caller's own grant is still given back.
  redis.call('ZREM', queue, waiter)
  redis.call('ZREM', deadlines, waiter)
end
-- Free: given back now, or nothing there.
if ARGV[2] ~= '' and (released == 1 or not held) then
  local first = queue_front(queue, true)
  local head = first and first[1]
  -- A user without channel permissions (Redis 7 ACLs) only loses the wake-up.
  if head then
    redis.pcall(ARGV[2], channel, 'f:' .. head)
  elseif released == 1 then
    redis.pcall(ARGV[2], channel, 'w')
  end
end
return released
