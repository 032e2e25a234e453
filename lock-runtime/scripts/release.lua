-- Delete a lock only if it is still held by the caller, and tell its waiters.
--
-- KEYS[1]  lock key
-- KEYS[2]  the lock's release channel (same hash tag as KEYS[1])
-- ARGV[1]  owner token
--
-- Returns 1 when the lock was ours and is now free, 0 when it was not ours (expired, taken
-- over, or deleted).

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  -- Wake waiters; a user without channel permissions (Redis 7 ACLs) only loses the wake-up.
  redis.pcall('PUBLISH', KEYS[2], '')
  return 1
end
return 0
