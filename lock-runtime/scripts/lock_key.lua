-- Shared by every script that reads or writes a lock's keys: `kind::script` (kind/mod.rs)
-- puts this text before each script's own (Redis scripts cannot include one another). It
-- holds the two rules every kind follows alike:
--
-- 1. A lock never modifies data it did not write. `lock_held` tells distlock's own structures
--    at a lock key from anything else, and refuses anything else with a NOTALOCK error before
--    the script writes a thing: a string is a writer's owner token (32 hex digits, ':', the ms
--    it was made, ':' and the holder record, see inspect.rs); a sorted set is readers or
--    permit holders, whose highest member is an owner token or a semaphore's '#permits:N'
--    marker. A hash, a list, a user's string or leaderboard at the key: NOTALOCK, nothing read
--    further, nothing changed.
--
-- 2. A script is given as keys only what exists with the lock: the lock key (and, on Redlock,
--    the fencing counter). While a Cluster slot migrates, Redis refuses a call naming a key
--    that is missing on the node it reaches (ASK, then TRYAGAIN), so the keys beside the lock
--    — the writer-waiting mark, the fair queue — come as arguments and are reached through
--    `beside`: a command on such a key that Redis refuses because the key lives on the other
--    node of a migration is nil, as if the key were not there. During a migration a writer
--    may then not keep readers out, or a fair waiter not keep its place, for a moment; no
--    grant is ever made or refused for it against the lock key itself.
--
-- The release channel is an argument too: `PUBLISH`/`SPUBLISH` take it from ARGV.

local function not_a_lock(key, what)
  error({err = 'NOTALOCK ' .. what .. ' at ' .. key})
end

local OWNER = '^' .. string.rep('%x', 32) .. ':%d+:'

local function is_owner(value)
  return type(value) == 'string' and string.find(value, OWNER) ~= nil
end

-- What holds the lock key: 'none'; 'writer' and its owner token; 'readers' and the highest
-- member; 'permits' and the '#permits:N' marker. Raises NOTALOCK for anything else.
local function lock_held(key)
  local held = redis.call('TYPE', key)['ok']
  if held == 'none' then
    return 'none'
  elseif held == 'string' then
    local owner = redis.call('GET', key)
    if is_owner(owner) then
      return 'writer', owner
    end
  elseif held == 'zset' then
    local top = redis.call('ZRANGE', key, -1, -1)[1]
    if top and string.sub(top, 1, 9) == '#permits:' then
      return 'permits', top
    elseif is_owner(top) then
      return 'readers', top
    end
  end
  not_a_lock(key, held)
end

-- A command on a key beside the lock: its reply, or nil when the key lives on the other node
-- of a Cluster slot migration. Any other error is raised.
local function beside(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, 'non local key', 1, true) then
      return nil
    end
    error(reply)
  end
  return reply
end

-- Whether the writer-waiting mark `name` is up (its PTTL, -2 when it is not).
local function writer_waiting(name)
  return beside('PTTL', name) or -2
end

-- Sets the writer-waiting mark `name` for `ms`, unless the key holds something that is not a
-- mark (NOTALOCK) or lives on the other node of a migration.
local function mark_writer_waiting(name, ms)
  local held = beside('TYPE', name)
  if not held then
    return
  end
  held = held['ok']
  if held ~= 'none' and not (held == 'string' and beside('GET', name) == '1') then
    not_a_lock(name, held)
  end
  beside('SET', name, '1', 'PX', ms)
end

-- Checks that the fair queue `name` (a sorted set of 24-hex-digit waiter ids) is one, or
-- absent: NOTALOCK otherwise. False when it lives on the other node of a migration.
local function own_queue(name)
  local held = beside('TYPE', name)
  if not held then
    return false
  end
  held = held['ok']
  if held == 'none' then
    return true
  end
  if held == 'zset' then
    local first = redis.call('ZRANGE', name, 0, 0)[1]
    if first and string.find(first, '^' .. string.rep('%x', 24) .. '$') then
      return true
    end
  end
  not_a_lock(name, held)
end
