-- Delete a lock only if it is still held by the caller.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
--
-- Returns 1 when the lock was ours and is now free, 0 when it was not ours (expired, taken
-- over, or deleted).

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
