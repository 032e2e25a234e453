-- Reset a held lock's lease only if it is still held by the caller.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
-- ARGV[2]  new lease in milliseconds
--
-- Returns 1 when the lease was reset, 0 when the lock was no longer ours.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
