-- Write (exclusive) side: delete the lock only if it is still held by the caller, and wake
-- its waiters.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
-- ARGV[2]  how the store announces: 'PUBLISH', or 'SPUBLISH' on Cluster (sharded pub/sub); ''
--          announces nothing (a Redlock try's give-back: kind/mod.rs `Announce::Nobody`)
-- ARGV[3]  the lock's release channel (an argument: lock_key.lua)
--
-- Publishes 'w': each client wakes one of its waiting writers, or all its waiting readers when
-- no writer of its own waits (a waiting writer has set the writer-waiting mark, so readers
-- would be refused anyway). The script does not look at the mark, which keeps a release as
-- cheap as without readers. It only deletes a key holding the caller's own owner token, so it
-- never touches data it did not write. Returns 1 when the lock was ours and is now free, 0 when it was
-- not ours (expired, taken over, deleted, or held by readers).

-- pcall: while readers hold the lock the key is a sorted set, and GET fails on it.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  -- Wake waiters; a user without channel permissions (Redis 7 ACLs) only loses the wake-up.
  if ARGV[2] ~= '' then
    redis.pcall(ARGV[2], ARGV[3], 'w')
  end
  return 1
end
return 0
