-- Fenced write (resource side): run the caller's write commands only if its fencing token is
-- at least the highest token this resource has accepted, and remember the token.
--
-- KEYS[1]  fence key: the highest token accepted so far (a decimal string; missing = none)
-- KEYS[2]  the guarded key (the commands' data); its time to live is mirrored on the fence key
-- ARGV[1]  the caller's fencing token (decimal u64, as Rust prints it: no sign, no leading zero)
-- ARGV[2]  how many commands follow
-- ARGV[3…] per command: its argument count, then its arguments, the command name first
--
-- Returns {1, reply, …} (one reply per command) when the token was current and the commands
-- ran, {0, highest} when the token is below `highest` and nothing was changed. An equal token
-- is current: one grant may write several times. A fence key that holds no token is an error
-- reply, and so is a command that fails; like MULTI/EXEC, commands that ran before a failing
-- one are not undone (the fence, raised first, then already holds the caller's token, which
-- was current).

-- `below` and `is_token` come from `token.lua`, put before this script.

local token = ARGV[1]
if not is_token(token) then
  return redis.error_reply('ERR fenced write: the token ' .. token .. ' is not a decimal number')
end
local highest = redis.call('GET', KEYS[1])
if highest then
  if not is_token(highest) then
    return redis.error_reply('ERR fenced write: the fence key ' .. KEYS[1] ..
      ' does not hold a fencing token; delete it or use another fence key')
  end
  if below(token, highest) then
    return {0, highest}
  end
end
if highest ~= token then
  redis.call('SET', KEYS[1], token)
end

local replies = {1}
local at = 3
for _ = 1, tonumber(ARGV[2]) do
  local argc = tonumber(ARGV[at])
  replies[#replies + 1] = redis.call(unpack(ARGV, at + 1, at + argc))
  at = at + argc + 1
end

-- The fence lives as long as the data it guards: an expiring value takes its fence with it,
-- a lasting (or deleted) one keeps it, so a stale holder cannot write it back.
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
else
  redis.call('PERSIST', KEYS[1])
end
return replies
