-- Election (election/mod.rs, election/proclaim.rs): the leader writes its record beside the
-- lock it leads by — its epoch (the grant's fencing token), its owner token, the value it
-- publishes and the record's revision — and announces it, so observers read it at once. The
-- campaign writes revision 0; each `Leadership::proclaim` a greater one. Only the lock's holder
-- writes it.
--
-- KEYS[1]  lock key (the election's write lock)
-- ARGV[1]  owner token of the leader's grant
-- ARGV[2]  the record key, a hash beside the lock (an argument, not a key: lock_key.lua)
-- ARGV[3]  the epoch
-- ARGV[4]  the value, ARGV[5] '1' when there is one ('0': none)
-- ARGV[6]  how the store announces: 'PUBLISH', or 'SPUBLISH' on Cluster
-- ARGV[7]  the lock's release channel, on which observers listen
-- ARGV[8]  the record's revision within the epoch (decimal)
--
-- Returns 1 when written; 0 when the caller does not hold the lock (any more), and nothing is
-- written; 2 when the record already holds this leader's value of the same or a later
-- revision (two proclaims that crossed: the later stands, nothing is written); -1 when the
-- record key lives on the other node of a Cluster slot migration (try again shortly). A record
-- key that holds anything but a record is NOTALOCK, and nothing is written.
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
if held ~= 'none' then
  local owner = held == 'hash' and redis.call('HGET', ARGV[2], 'owner')
  if not (owner and is_owner(owner)) then
    not_a_lock(ARGV[2], held)
  end
  if owner == ARGV[1] then
    local revision = tonumber(redis.call('HGET', ARGV[2], 'revision'))
    if revision and revision >= tonumber(ARGV[8]) then
      return 2
    end
  end
end
redis.call('HSET', ARGV[2], 'epoch', ARGV[3], 'owner', ARGV[1], 'revision', ARGV[8])
if ARGV[5] == '1' then
  redis.call('HSET', ARGV[2], 'value', ARGV[4])
else
  redis.call('HDEL', ARGV[2], 'value')
end
-- A user without channel permissions (Redis 7 ACLs) only loses the wake-up.
redis.pcall(ARGV[6], ARGV[7], 'e:' .. ARGV[3])
return 1
