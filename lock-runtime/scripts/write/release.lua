-- Write (exclusive) side: delete the lock only if it is still held by the caller, and tell
-- its waiters whom the release is for.
--
-- KEYS[1]  lock key
-- KEYS[2]  the lock's release channel
-- KEYS[3]  writer-waiting mark
-- ARGV[1]  owner token
--
-- The writer-waiting mark goes with the lock: it names a writer that is waiting, and that
-- writer is woken now. Publishes 'w' (wake one writer) when there was a mark, else 'r' (wake
-- the readers). Returns 1 when the lock was ours and is now free, 0 when it was not ours
-- (expired, taken over, deleted, or held by readers).

-- pcall: while readers hold the lock the key is a sorted set, and GET fails on it.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  local whom = 'r'
  if redis.call('DEL', KEYS[1], KEYS[3]) == 2 then
    whom = 'w'
  end
  -- Wake waiters; a user without channel permissions (Redis 7 ACLs) only loses the wake-up.
  redis.pcall('PUBLISH', KEYS[2], whom)
  return 1
end
return 0
