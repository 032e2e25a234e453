-- Redlock, `force_unlock`: raise a master's fencing counter to a token above every token
-- handed out for the key, so that every later grant (whose quorum shares at least one master
-- with any majority this ran on) takes a larger token. See redlock.rs for the argument.
-- After lock_key.lua (`kind::script`), for `fencing_counter`.
--
-- KEYS[1]  fencing counter
-- ARGV[1]  the token
-- ARGV[2]  time to live of the counter in milliseconds beyond the token: the counter lives
--          until this master's clock has passed the token and then ARGV[2] ms, as a grant's
--          does (write/acquire.lua)
--
-- Returns 1 (the counter is at least the token now). A counter that is not a number is a
-- NOTALOCK error; a counter or a token of 2^53 or more, which the comparison below (doubles)
-- would round, is a FENCETOOLARGE error: nothing is written (a counter raised past 2^53
-- would refuse every later grant).

local current = fencing_counter(KEYS[1])
local token = tonumber(ARGV[1])
if token >= TOKEN_LIMIT then
  refuse_too_large(KEYS[1], ARGV[1])
end
if current and current >= token then
  return 1
end
-- Scripts replicate their effects (default since Redis 5), so reading TIME is allowed.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ahead = math.max(0, math.floor(token / 1000) - now_ms)
redis.call('SET', KEYS[1], ARGV[1], 'PX', string.format('%d', ahead + tonumber(ARGV[2])))
return 1
