-- Take a lock if it is free and hand out the next fencing token, in one round trip.
--
-- KEYS[1]  lock key (holds the owner token while held)
-- KEYS[2]  fencing counter (same hash tag as KEYS[1])
-- ARGV[1]  owner token (random, 128 bits)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  time to live of the fencing counter in milliseconds
--
-- Returns {1, token} when granted, {0, pttl} when held by another owner
-- (pttl: the holder's remaining lease in ms, -1 when the key has no expiry).
--
-- A missing counter is seeded from the server clock in microseconds, so tokens keep
-- increasing across a restart of a Redis that keeps nothing on disk. This assumes the
-- server clock does not step back, and that a key sees fewer grants than microseconds pass.

if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    -- Scripts replicate their effects (default since Redis 5), so reading TIME is allowed.
    local now = redis.call('TIME')
    redis.call('SET', KEYS[2], now[1] .. string.format('%06d', tonumber(now[2])))
  end
  local token = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return {1, token}
end
return {0, redis.call('PTTL', KEYS[1])}
