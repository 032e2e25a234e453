-- Operator's force-unlock, for every kind: frees the lock whatever holds it (the writer,
-- every reader, or every semaphore permit) and the writer-waiting mark, wakes the waiters, and returns a fencing token
-- above every token handed out for the key so far, so a fenced store given it rejects the
-- evicted holders' late writes.
--
-- KEYS[1]  lock key
-- KEYS[2]  writer-waiting mark
-- KEYS[3]  the lock's release channel
-- KEYS[4]  fencing counter, only with counter tokens (Redlock)
-- ARGV[1]  how the store announces: 'PUBLISH', or 'SPUBLISH' on Cluster
-- ARGV[2]  with KEYS[4]: the shortest time to live of the raised counter, ms
--
-- Returns {holders, token}: the evicted holders as {{owner, remaining ms}, ...} (never a
-- semaphore's '#permits:N' marker) and the token.
-- A key of another type than a lock's is left alone (error reply).
--
-- The token is the server clock in microseconds: every token so far was read from this clock
-- (or, with a counter, one above the counter when the counter was not below the clock), and
-- every later grant reads it again at least a round trip later (see write/acquire.lua). With
-- a counter, the token is also above the counter, and the counter is raised to it, so the next
-- grant's token (the counter + 1 at least) is above it too.

local held = redis.call('TYPE', KEYS[1])['ok']
if held ~= 'string' and held ~= 'zset' and held ~= 'none' then
  return redis.error_reply('ERR lock key ' .. KEYS[1] .. ' holds a ' .. held .. ', not a lock')
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local holders = {}
if held == 'string' then
  holders[1] = {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
elseif held == 'zset' then
  local members = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now_ms, '(+inf', 'WITHSCORES')
  for i = 1, #members, 2 do
    holders[#holders + 1] = {members[i], tonumber(members[i + 1]) - now_ms}
  end
end
redis.call('DEL', KEYS[1], KEYS[2])
-- Wake waiters; a user without channel permissions (Redis 7 ACLs) only loses the wake-up.
redis.pcall(ARGV[1], KEYS[3], 'w')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
if KEYS[4] then
  local last = redis.call('GET', KEYS[4])
  if last then
    last = tonumber(last)
    if not last then
      return redis.error_reply('ERR fencing counter ' .. KEYS[4] .. ' is not a number')
    end
    if last >= token then
      token = last + 1
    end
  end
  local ttl = math.max(redis.call('PTTL', KEYS[4]), tonumber(ARGV[2]))
  redis.call('SET', KEYS[4], string.format('%d', token), 'PX', ttl)
end
return {holders, token}
