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
-- The head goes straight to the write side's try, reading nothing but the queue's first entry,
-- and a granted waiter leaves the queue in the same script; a try that waits keeps its place
-- and pushes its deadline one and a half heartbeats ahead. Only a try that waits looks at the
-- deadlines, and it drops the waiters whose deadline has passed only when the earliest one
-- has (so a crashed or cut-off waiter leaves the queue one and a half heartbeats after its
-- last try, at the next try of a waiter behind it or of a newcomer; a dead head holds up only
-- those, and only while the lock is free). A waiter not at the head that finds the lock free
-- wakes the head ('f:' and its id), so a head that missed its wake-up, or a new head after a
-- dead one was dropped, does not wait for its own next try.
--
-- The queue's two keys expire together, never before the latest deadline they hold: a try
-- that waits makes sure they last its own `keep` at least and, when they would not, lengthens
-- both to twice that (GT: never shortens them, as waiters may have heartbeats of their own),
-- so most tries read the expiry and write none.

local waiter = string.sub(ARGV[1], 1, 24)
local queue, deadlines, channel = ARGV[10], ARGV[11], ARGV[12]
local ticket = ARGV[8]

-- The head: the write side's try.
local function write_try()
  --[[ write/acquire.lua ]]
end

-- Whether this waiter is the head of a queue whose first entry is `first` ({id, place}, {}
-- when empty): the first itself, or a waiter coming back with a place before the first's. (A
-- first try on one server, ticket '0', comes after everyone already queued.)
local function at_head(first)
  if first[1] == nil or first[1] == waiter then
    return true
  end
  if ticket == '0' then
    return false
  end
  local mine, theirs = tonumber(ticket), tonumber(first[2])
  return mine < theirs or (mine == theirs and waiter < first[1])
end

-- The head's try; a grant takes the waiter out of the queue (`first`: the queue's first entry).
-- pcall: the deadlines may live on the other node of a migration, or hold something else,
-- which is left alone.
local function take(first)
  local reply = write_try()
  if reply[1] == 1 and first[1] == waiter then
    redis.call('ZREM', queue, waiter)
    redis.pcall('ZREM', deadlines, waiter)
  end
  return reply
end

-- While the queue cannot be reached (a Cluster slot migration) a try is the write side's alone.
local first = queue_front(queue)
if not first then
  return write_try()
end
local head = at_head(first)
local refused = nil
local free = false
if head then
  refused = take(first)
  if refused[1] ~= 0 then
    return refused
  end
else
  -- NOTALOCK before anything is written (lock_key.lua): one GET for what a lock key holds
  -- most often, nothing or a writer, lock_held for anything else.
  local value = redis.pcall('GET', KEYS[1])
  if value == ARGV[1] then
    -- This very try, sent again after its reply was lost: granted again.
    return take(first)
  elseif not value then
    free = true
  elseif not (type(value) == 'string' and is_owner(value)) then
    free = lock_held(KEYS[1]) == 'none'
  end
end

-- The try waits: the head while the lock is held, or a waiter behind others.
local earliest = queue_front(deadlines)
if not earliest then
  return refused or write_try()
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local keep = math.floor(tonumber(ARGV[7]) * 3 / 2)

if earliest[2] and tonumber(earliest[2]) <= now_ms then
  local dead = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now_ms)
  for _, gone in ipairs(dead) do
    redis.call('ZREM', queue, gone)
    redis.call('ZREM', deadlines, gone)
  end
  first, earliest = queue_front(queue), queue_front(deadlines)
  if not head and at_head(first) then
    head = true
    refused = take(first)
    if refused[1] ~= 0 then
      return refused
    end
    free = false
  end
end

-- NX: a waiter keeps the place it first took; a waiter dropped meanwhile comes back with its
-- ticket (Redlock, or the place an earlier reply gave it) or at the back (its first try on
-- one server: the server clock).
local place
if first[1] == waiter then
  place = tonumber(first[2])
else
  if ticket == '0' then
    ticket = string.format('%d', tonumber(now[1]) * 1000000 + tonumber(now[2]))
  end
  -- Already queued under a place the caller sent is queued at that very place (a reply gave
  -- it); under the server clock (a first try sent again) it is looked up.
  if redis.call('ZADD', queue, 'NX', ticket, waiter) == 1 or ARGV[8] ~= '0' then
    place = tonumber(ticket)
  else
    place = tonumber(redis.call('ZSCORE', queue, waiter))
  end
end
redis.call('ZADD', deadlines, now_ms + keep, waiter)

local made_queue, made_deadlines = first[1] == nil, earliest[1] == nil
if made_queue and made_deadlines then
  redis.call('PEXPIRE', queue, 2 * keep)
  redis.call('PEXPIRE', deadlines, 2 * keep)
elseif made_queue or made_deadlines then
  -- One key made anew beside the other (the two out of step after a migration): both expire
  -- when the later of the two would.
  local at = now_ms + 2 * keep
  for _, key in ipairs({queue, deadlines}) do
    at = math.max(at, now_ms + redis.call('PTTL', key))
  end
  redis.call('PEXPIREAT', queue, at)
  redis.call('PEXPIREAT', deadlines, at)
else
  local ttl = redis.call('PTTL', queue)
  if ttl < 0 then
    -- No expiry (set by nobody here): given one again.
    redis.call('PEXPIRE', queue, 2 * keep)
    redis.call('PEXPIRE', deadlines, 2 * keep)
  elseif ttl < keep then
    redis.call('PEXPIRE', queue, 2 * keep, 'GT')
    redis.call('PEXPIRE', deadlines, 2 * keep, 'GT')
  end
end

if head then
  refused[3] = place
  return refused
end
if free then
  redis.pcall(ARGV[9], channel, 'f:' .. first[1])
end
return {0, -3, place}
