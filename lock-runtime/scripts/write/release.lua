-- Write (exclusive) side: delete the lock only if it is still held by the caller, and tell
-- its waiters whom the release is for.
--
-- KEYS[1]  lock key
-- KEYS[2]  the lock's release channel
-- KEYS[3]  writer-waiting mark
-- ARGV[1]  owner token
--
-- Publishes 'w' (wake one writer) when a writer is waiting, else 'r' (wake the readers).
-- Returns 1 when the lock was ours and is now free, 0 when it was not ours (expired, taken
-- over, or deleted).

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local whom = 'r'
  if redis.call('EXISTS', KEYS[3]) == 1 then
    whom = 'w'
  end
  -- Wake waiters; a user without channel permissions (Redis 7 ACLs) only loses the wake-up.
  redis.pcall('PUBLISH', KEYS[2], whom)
  return 1
end
return 0
