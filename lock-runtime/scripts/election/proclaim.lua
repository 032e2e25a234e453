-- Election (election/mod.rs): the leader writes its record beside the lock it leads by — its
-- epoch (the grant's fencing token), its owner token and the value it publishes — and
-- announces it, so observers read the new leader at once. Only the lock's holder writes it.
--
-- KEYS[1]  lock key (the election's write lock)
-- ARGV[1]  owner token of the leader's grant
-- ARGV[2]  the record key, a hash beside the lock (an argument, not a key: lock_key.lua)
-- ARGV[3]  the epoch
-- ARGV[4]  the value, ARGV[5] '1' when there is one ('0': none)
-- ARGV[6]  how the store announces: 'PUBLISH', or 'SPUBLISH' on Cluster
-- ARGV[7]  the lock's release channel, on which observers listen
--
-- Returns 1 when written; 0 when the caller does not hold the lock (any more); -1 when the
-- record key lives on the other node of a Cluster slot migration (try again shortly). A
-- record key that holds anything but a record is NOTALOCK, and nothing is written.
--
-- The record is kept after its leader's term (no expiry): it is trusted only while its owner
-- holds the lock (inspect.lua reads both at once), and the next leader overwrites it.

if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local held = beside('TYPE', ARGV[2])
if not held then
  return -1
end
held = held['ok']
if held ~= 'none' and not (held == 'hash' and is_owner(redis.call('HGET', ARGV[2], 'owner'))) then
  not_a_lock(ARGV[2], held)
end
redis.call('HSET', ARGV[2], 'epoch', ARGV[3], 'owner', ARGV[1])
if ARGV[5] == '1' then
  redis.call('HSET', ARGV[2], 'value', ARGV[4])
else
  redis.call('HDEL', ARGV[2], 'value')
end
-- A user without channel permissions (Redis 7 ACLs) only loses the wake-up.
redis.pcall(ARGV[6], ARGV[7], 'e:' .. ARGV[3])
return 1
