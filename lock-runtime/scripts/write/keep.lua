-- Write (exclusive) side, held at least until a moment (`hold_at_least`): instead of deleting
-- the lock, the release leaves it to expire at the end of that window, without renewal, so
-- nobody else takes it before then. Only if it is still held by the caller.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
-- ARGV[2]  how the store announces (unused: nothing is released yet, nobody is woken)
-- ARGV[3]  milliseconds the lock is kept from now (at least 1)
--
-- Returns 1 when the lock was ours (it now expires in ARGV[3] ms), 0 when it was not (expired,
-- taken over, deleted, or held by readers). It never touches data it did not write.

-- pcall: while readers hold the lock the key is a sorted set, and GET fails on it.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
