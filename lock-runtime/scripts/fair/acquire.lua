-- Fair (queued) exclusive lock: one try of a waiter, in one round trip. The grant is the write
-- side of the key's lock (the same lock key, renewed and released as a write grant is); what
-- makes it fair is a queue beside it that only its head may leave with the lock.
--
-- The head's try is the write side's, write/acquire.lua, which kind/fair.rs inserts below
-- (Redis scripts cannot include one another): the first keys and arguments are its own.
--
-- KEYS[1]  lock key (see write/acquire.lua)
-- KEYS[2]  fencing counter, only with counter tokens (Redlock); see write/acquire.lua
-- ARGV[1]  owner token of this try; its first 24 characters are the waiter id, the same for
--          every try of one request (each try still has an owner token of its own)
-- ARGV[2..6]  as write/acquire.lua: the lease in ms, where the fencing token comes from, the
--          writer-waiting mark's time to live in ms, whether an earlier try was refused, and
--          the mark's key
-- ARGV[7]  the heartbeat in ms: a waiter tries again at least every half heartbeat; one that
--          does not try for one and a half heartbeats is dropped from the queue
-- ARGV[8]  the waiter's place, should it have to join the queue: '0' on a waiter's first try
--          on one server (its place is then the server clock in microseconds: the order the
--          requests reached it); the place an earlier reply gave it (so a waiter dropped while
--          alive, or whose late grant was undone, comes back where it was); on Redlock, the
--          caller's clock when the request started (the same on every master, so the masters'
--          queues agree)
-- ARGV[9]  how the store announces: 'PUBLISH', or 'SPUBLISH' on Cluster
-- ARGV[10] the queue: a sorted set of waiter ids scored by their place (the server clock in
--          microseconds when the waiter first came, or the ticket of ARGV[8])
-- ARGV[11] the queue's deadlines: the same waiter ids scored by when each is dropped from the
--          queue unless it tries again (ms on the server clock)
-- ARGV[12] the lock's release channel, on which the head is woken
-- (all keys share one hash tag; the queue's keys are arguments, not keys: lock_key.lua.
-- While the queue's keys cannot be reached during a Cluster slot migration, a try is the
-- write side's alone: unfair until the migration ends, never unsafe.)
--
-- Returns as write/acquire.lua: {1, token} when granted ({1, -1} without a token); when
-- refused, {0, ms, place}: ms is the holder's PTTL when this waiter is the head and the lock
-- is held (-1: no expiry), or -3 when waiters are ahead of it (it tries again after half a
-- heartbeat, or when woken); place is the waiter's place in the queue, for its next tries.
--
-- Every try first drops the waiters whose deadline has passed: a crashed or cut-off waiter
-- leaves the queue one and a half heartbeats after its last try, whichever waiter's try comes
-- next. A waiter not at the head that finds the lock free wakes the head ('f:' and its id), so
-- a head that missed its wake-up, or a new head after a dead one was dropped, does not wait for
-- its own next try. A granted waiter leaves the queue in the same script.

local waiter = string.sub(ARGV[1], 1, 24)
local queue, deadlines, channel = ARGV[10], ARGV[11], ARGV[12]

-- The head: the write side's try.
local function write_try()
  --[[ write/acquire.lua ]]
end

-- Not a lock at all: NOTALOCK before anything is written (lock_key.lua).
lock_held(KEYS[1])
if not (own_queue(queue) and own_queue(deadlines)) then
  return write_try()
end

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local heartbeat = tonumber(ARGV[7])
local keep = math.floor(heartbeat * 3 / 2)

local dead = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now_ms)
for _, gone in ipairs(dead) do
  redis.call('ZREM', queue, gone)
  redis.call('ZREM', deadlines, gone)
end

local ticket = ARGV[8]
if ticket == '0' then
  ticket = string.format('%d', tonumber(now[1]) * 1000000 + tonumber(now[2]))
end
-- NX: a waiter keeps the place it first took; a waiter dropped meanwhile comes back with its
-- ticket (Redlock) or at the back (the clock: it had stopped showing it was alive).
redis.call('ZADD', queue, 'NX', ticket, waiter)
redis.call('ZADD', deadlines, now_ms + keep, waiter)
-- The queue may expire with its last deadline: each waiter's is at most its own `keep` away,
-- and waiters may have heartbeats of their own, so a try only ever lengthens the expiry.
for _, key in ipairs({queue, deadlines}) do
  if redis.call('PTTL', key) < keep then
    redis.call('PEXPIRE', key, keep)
  end
end
local place = tonumber(redis.call('ZSCORE', queue, waiter))

local head = redis.call('ZRANGE', queue, 0, 0)[1]
if head ~= waiter then
  if redis.call('EXISTS', KEYS[1]) == 0 then
    redis.pcall(ARGV[9], channel, 'f:' .. head)
  end
  return {0, -3, place}
end

local reply = write_try()
if reply[1] == 1 then
  redis.call('ZREM', queue, waiter)
  redis.call('ZREM', deadlines, waiter)
elseif reply[1] == 0 then
  reply[3] = place
end
return reply
