-- Fair (queued) exclusive lock: one try of a waiter, in one round trip. The grant is the write
-- side of the key's lock (the same lock key, renewed and released as a write grant is); what
-- makes it fair is a queue beside it that only its head may leave with the lock.
--
-- KEYS[1]  lock key (see write/acquire.lua)
-- KEYS[2]  writer-waiting mark (see write/acquire.lua)
-- KEYS[3]  the queue: a sorted set of waiter ids scored by their place (the server clock in
--          microseconds when the waiter first came, or the ticket of ARGV[7])
-- KEYS[4]  the queue's deadlines: the same waiter ids scored by when each is dropped from the
--          queue unless it tries again (ms on the server clock)
-- KEYS[5]  the lock's release channel, on which the head is woken
-- KEYS[6]  fencing counter, only with counter tokens (Redlock); see write/acquire.lua
-- ARGV[1]  owner token of this try; its first 24 characters are the waiter id, the same for
--          every try of one request (each try still has an owner token of its own)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  where the fencing token comes from: 'clock', '0' or the counter's ttl in ms (see
--          write/acquire.lua)
-- ARGV[4]  time to live of the writer-waiting mark in ms (0: no mark)
-- ARGV[5]  '1' when an earlier try of this request found the lock held
-- ARGV[6]  the heartbeat in ms: a waiter tries again at least every half heartbeat; one that
--          does not try for one and a half heartbeats is dropped from the queue
-- ARGV[7]  the waiter's ticket, its place in the queue when it first comes: '0' for the server
--          clock in microseconds (one server: the order the requests reached it), or a number
--          from the caller (Redlock: the same on every master, so the masters' queues agree)
-- ARGV[8]  how the store announces: 'PUBLISH', or 'SPUBLISH' on Cluster
-- (all keys share one hash tag)
--
-- Returns as write/acquire.lua: {1, token} when granted ({1, -1} without a token), {0, ms}
-- when this waiter is the head and the lock is held (ms: the holder's PTTL), and {0, -3} when
-- waiters are ahead of it (it tries again after half a heartbeat, or when woken).
--
-- Every try first drops the waiters whose deadline has passed: a crashed or cut-off waiter
-- leaves the queue one and a half heartbeats after its last try, whichever waiter's try comes
-- next. A waiter not at the head that finds the lock free wakes the head ('f:' and its id), so
-- a head that missed its wake-up, or a new head after a dead one was dropped, does not wait for
-- its own next try. A granted waiter leaves the queue in the same script.

local waiter = string.sub(ARGV[1], 1, 24)
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local heartbeat = tonumber(ARGV[6])
local keep = math.floor(heartbeat * 3 / 2)

local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms)
for _, gone in ipairs(dead) do
  redis.call('ZREM', KEYS[3], gone)
  redis.call('ZREM', KEYS[4], gone)
end

local ticket = ARGV[7]
if ticket == '0' then
  ticket = string.format('%d', tonumber(now[1]) * 1000000 + tonumber(now[2]))
end
-- NX: a waiter keeps the place it first took; a waiter dropped meanwhile comes back with its
-- ticket (Redlock) or at the back (the clock: it had stopped showing it was alive).
redis.call('ZADD', KEYS[3], 'NX', ticket, waiter)
redis.call('ZADD', KEYS[4], now_ms + keep, waiter)
-- Every member's deadline is at most `keep` away, so the queue may expire with the last one.
redis.call('PEXPIRE', KEYS[3], keep)
redis.call('PEXPIRE', KEYS[4], keep)

local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
if head ~= waiter then
  if redis.call('EXISTS', KEYS[1]) == 0 then
    redis.pcall(ARGV[8], KEYS[5], 'f:' .. head)
  end
  return {0, -3}
end

-- The head: the write side's try (write/acquire.lua).
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- pcall: while readers hold the lock the key is a sorted set, and GET fails on it.
  if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
    if ARGV[4] ~= '0' then
      redis.call('SET', KEYS[2], '1', 'PX', ARGV[4])
    end
    return {0, redis.call('PTTL', KEYS[1])}
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
redis.call('ZREM', KEYS[3], waiter)
redis.call('ZREM', KEYS[4], waiter)
if ARGV[5] == '1' then
  redis.call('DEL', KEYS[2])
end
if ARGV[3] == '0' then
  return {1, -1}
end
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
if ARGV[3] == 'clock' then
  return {1, token}
end
local last = redis.pcall('SET', KEYS[6], string.format('%d', token), 'PX', ARGV[3], 'GET')
if type(last) == 'table' and last.err then
  redis.call('DEL', KEYS[1])
  return redis.error_reply('ERR fencing counter ' .. KEYS[6] .. ' is unusable: ' .. tostring(last.err))
end
last = tonumber(last)
if last and last >= token then
  token = last + 1
  redis.call('SET', KEYS[6], string.format('%d', token), 'PX', ARGV[3])
end
return {1, token}
