-- Redlock, `force_unlock`: raise a master's fencing counter to a token above every token
-- handed out for the key, so that every later grant (whose quorum shares at least one master
-- with any majority this ran on) takes a larger token. See redlock.rs for the argument.
--
-- KEYS[1]  fencing counter
-- ARGV[1]  the token
-- ARGV[2]  time to live of the counter in milliseconds beyond the token: the counter lives
--          until this master's clock has passed the token and then ARGV[2] ms, as a grant's
--          does (write/acquire.lua)
--
-- Returns 1 (the counter is at least the token now). A counter that is not a number is an
-- error reply.

local current = redis.call('GET', KEYS[1])
local token = tonumber(ARGV[1])
if current then
  local value = tonumber(current)
  if not value then
    return redis.error_reply('ERR fencing counter ' .. KEYS[1] .. ' is not a number')
  end
  if value >= token then
    return 1
  end
end
-- Scripts replicate their effects (default since Redis 5), so reading TIME is allowed.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ahead = math.max(0, math.floor(token / 1000) - now_ms)
redis.call('SET', KEYS[1], ARGV[1], 'PX', ahead + tonumber(ARGV[2]))
return 1
