-- Operator's view of one lock, for every kind, read-only: who holds it (a writer or the
-- readers, each with its remaining lease), whether a writer waits, how many clients listen
-- for its release, and the fencing state.
--
-- KEYS[1]  lock key (a string while a writer holds it, the readers' sorted set while readers do)
-- KEYS[2]  fencing counter, only with counter tokens (Redlock)
-- ARGV[1]  how subscribers are counted: 'NUMSUB', or 'SHARDNUMSUB' on Cluster
-- ARGV[2]  writer-waiting mark's key, ARGV[3] the lock's release channel, ARGV[4] the fair
--          queue's deadlines (fair/acquire.lua), ARGV[5] an election's leader record
--          (election/proclaim.lua) (arguments, not keys: lock_key.lua)
--
-- A key that holds anything but a lock, or a counter that holds anything but a number, is a
-- NOTALOCK error (lock_key.lua).
--
-- Returns {type, pttl, holders, waiting, subscribers, seconds, microseconds, counter,
-- permits, queued, record}: the lock key's TYPE ('none', 'string' or 'zset'), its
-- PTTL, the live holders as {{owner, remaining ms}, ...} (a semaphore's permit owners, never
-- its '#permits:N' marker, semaphore/acquire.lua), the writer-waiting mark's PTTL (-2: none),
-- the release channel's subscriber count, the server's TIME, the counter's value (nil when
-- there is none), N when the key is a semaphore (nil otherwise), the number of fair
-- waiters whose deadline has not passed, and the leader record {epoch, owner, value, revision}
-- (election/proclaim.lua) if the key is an election's (nil otherwise; whether its owner still
-- holds the lock is the caller's to compare, with the holders read here in the same script).

local held = lock_held(KEYS[1])
local types = {none = 'none', writer = 'string', readers = 'zset', permits = 'zset'}
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local pttl = redis.call('PTTL', KEYS[1])
local holders = {}
if held == 'writer' then
  holders[1] = {redis.call('GET', KEYS[1]), pttl}
elseif held ~= 'none' then
  -- Readers whose lease ended are not holders, even before a script purges them; nor is a
  -- semaphore's marker (scored +inf).
  local members = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now_ms, '(+inf', 'WITHSCORES')
  for i = 1, #members, 2 do
    holders[#holders + 1] = {members[i], tonumber(members[i + 1]) - now_ms}
  end
end
local permits = false
if held == 'permits' then
  permits = string.sub(redis.call('ZRANGE', KEYS[1], -1, -1)[1], 10)
end
local subscribers = 0
-- pcall: a user without the right to PUBSUB (Redis 7 ACLs) only loses the count.
local counted = redis.pcall('PUBSUB', ARGV[1], ARGV[3])
if type(counted) == 'table' and not counted.err then
  subscribers = counted[2]
end
local counter = false
if KEYS[2] and counter_value(KEYS[2]) then
  -- As it is, also at 2^53 or more (the caller parses the digits): a look grants nothing.
  counter = redis.call('GET', KEYS[2])
end
local queued = 0
if own_queue(ARGV[4], true) then
  queued = redis.call('ZCOUNT', ARGV[4], '(' .. now_ms, '+inf')
end
-- Leniently: something else at the record key (or the key on the other node of a slot
-- migration) only means no record is shown.
local record = false
local fields = redis.pcall('HMGET', ARGV[5], 'epoch', 'owner', 'value', 'revision')
if type(fields) == 'table' and not fields.err and fields[1] and fields[2] then
  record = fields
end
return {types[held], pttl, holders, writer_waiting(ARGV[2]), subscribers, now[1], now[2], counter,
  permits, queued, record}
