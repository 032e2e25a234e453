-- Multi-key lock (lock_all): give back every lock of the grant that the caller still holds,
-- and wake each one's waiters.
--
-- KEYS     the locks' keys
-- ARGV[1]  owner token
-- ARGV[2]  how the store announces: 'PUBLISH', or 'SPUBLISH' on Cluster; '' announces
--          nothing (a Redlock try's give-back)
-- ARGV[2 + i]  lock i's release channel (arguments, not keys: lock_key.lua)
--
-- Returns how many locks were ours and are now free (each is announced as write/release.lua
-- announces it); a lock no longer ours (expired, taken over, force-unlocked) is left alone.

local released = 0
for i = 1, #KEYS do
  -- pcall: while readers hold a lock its key is a sorted set, and GET fails on it.
  if redis.pcall('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    -- A user without channel permissions (Redis 7 ACLs) only loses the wake-up.
    if ARGV[2] ~= '' then
      redis.pcall(ARGV[2], ARGV[2 + i], 'w')
    end
    released = released + 1
  end
end
return released
