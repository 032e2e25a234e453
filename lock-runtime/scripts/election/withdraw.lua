-- Election (election/mod.rs): a leader that resigns deletes its record, if it is still its
-- own, before it gives the lock back.
--
-- KEYS[1]  lock key (routes the call to the lock's node; not touched)
-- ARGV[1]  owner token of the leader's grant
-- ARGV[2]  the record key (an argument, not a key: lock_key.lua)
--
-- Returns 1 when deleted, 0 when the record is another leader's, gone, or on the other node
-- of a Cluster slot migration.

local owner = redis.pcall('HGET', ARGV[2], 'owner')
if owner == ARGV[1] then
  redis.call('DEL', ARGV[2])
  return 1
end
return 0
