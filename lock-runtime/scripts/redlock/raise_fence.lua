-- Redlock: raise a master's fencing counter to a token chosen from a quorum, so that every
-- later quorum (which shares at least one master with any majority this ran on) hands out a
-- larger token. See redlock.rs for the argument.
--
-- KEYS[1]  fencing counter
-- ARGV[1]  the chosen token
-- ARGV[2]  time to live of the counter in milliseconds
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
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
