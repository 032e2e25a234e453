-- Operator's force-unlock, for every kind: frees the lock whatever holds it (the writer,
-- every reader, or every semaphore permit) and the writer-waiting mark, wakes the waiters, and returns a fencing token
-- above every token handed out for the key so far, so a fenced store given it rejects the
-- evicted holders' late writes.
--
-- KEYS[1]  lock key
-- KEYS[2]  fencing counter, only with counter tokens (Redlock)
-- ARGV[1]  how the store announces: 'PUBLISH', or 'SPUBLISH' on Cluster
-- ARGV[2]  with KEYS[2]: the shortest time to live of the raised counter, ms
-- ARGV[3]  writer-waiting mark's key, ARGV[4] the lock's release channel (arguments, not
--          keys: lock_key.lua)
--
-- Returns {holders, token}: the evicted holders as {{owner, remaining ms}, ...} (never a
-- semaphore's '#permits:N' marker) and the token.
-- A key that holds anything but a lock is left alone: a NOTALOCK error (lock_key.lua); so is
-- a counter that holds anything but a number, and one at 2^53 - 1 or more is a FENCETOOLARGE
-- error (the token would reach 2^53).
--
-- The token is the server clock in microseconds: without a counter every token so far was
-- read from this clock, and every later grant reads it again at least a round trip later (see
-- write/acquire.lua). With a counter (Redlock, where a token is a client's proposal that this
-- master took only above its live counter and not below its clock), the token is also above
-- the counter, and the counter is raised to it, so the next grant's token (a proposal above
-- the live counter) is above it too.

local held = lock_held(KEYS[1])
local last
if KEYS[2] then
  -- Before anything is deleted: a counter of another application's is NOTALOCK, one of 2^53
  -- or more FENCETOOLARGE, and so is one a token above which would be 2^53 (lock_key.lua).
  last = fencing_counter(KEYS[2])
  if last and last + 1 >= TOKEN_LIMIT then
    refuse_too_large(KEYS[2], redis.call('GET', KEYS[2]))
  end
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local holders = {}
if held == 'writer' then
  holders[1] = {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
elseif held ~= 'none' then
  local members = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now_ms, '(+inf', 'WITHSCORES')
  for i = 1, #members, 2 do
    holders[#holders + 1] = {members[i], tonumber(members[i + 1]) - now_ms}
  end
end
redis.call('DEL', KEYS[1])
if writer_waiting(ARGV[3]) ~= -2 then
  beside('DEL', ARGV[3])
end
-- Wake waiters; a user without channel permissions (Redis 7 ACLs) only loses the wake-up.
redis.pcall(ARGV[1], ARGV[4], 'w')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
if KEYS[2] then
  if last and last >= token then
    token = last + 1
  end
  local ttl = math.max(redis.call('PTTL', KEYS[2]), tonumber(ARGV[2]))
  redis.call('SET', KEYS[2], string.format('%d', token), 'PX', string.format('%d', ttl))
end
return {holders, token}
