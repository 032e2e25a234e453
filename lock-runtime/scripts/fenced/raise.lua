-- Raise a fence (operator side): make the fence key hold at least the given token, so every
-- write with a lower token is refused from now on (`write.lua` keeps the fence it reads). Used
-- after a forced unlock, with the token it returned: the evicted holders' tokens are below it.
--
-- KEYS[1]  fence key: the highest token accepted so far (a decimal string; missing = none)
-- KEYS[2]  the guarded key; its time to live is mirrored on the fence key, as `write.lua` does
-- ARGV[1]  the token to raise the fence to (decimal u64, as Rust prints it)
--
-- Returns {1, previous} when the fence was lower (previous: its token, or false when there was
-- no fence) and now holds the token; {0, highest} when it already held the token or a higher
-- one, left exactly as it was (never lowered). A fence key holding anything but a token (another
-- type, or a string that is no decimal number) is an error reply, and nothing is changed.

-- `below` and `is_token` come from `token.lua`, put before this script.

local token = ARGV[1]
if not is_token(token) then
  return redis.error_reply('ERR fence raise: the token ' .. token .. ' is not a decimal number')
end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'string' then
  return redis.error_reply('ERR fence raise: the key ' .. KEYS[1] .. ' holds a ' .. kind ..
    ', not a fencing token; left untouched (is it the fence of the key you meant?)')
end
local highest = redis.call('GET', KEYS[1])
if highest then
  if not is_token(highest) then
    return redis.error_reply('ERR fence raise: the key ' .. KEYS[1] ..
      ' does not hold a fencing token; left untouched (is it the fence of the key you meant?)')
  end
  if not below(highest, token) then
    return {0, highest}
  end
end
redis.call('SET', KEYS[1], token)

-- The fence lives as long as the data it guards, as after a fenced write.
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {1, highest}
