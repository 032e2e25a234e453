-- Shared by every script that reads a lock key or a key beside it: `kind::script`
-- (kind/mod.rs) puts this text before each such script's own (Redis scripts cannot include
-- one another; a script that only compares a key with the caller's own owner token — a
-- release, a renewal — goes without it, which keeps it as cheap as before). It
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
--    node of a migration (or, on the migrating node, does not exist yet) is nil, as if the
--    key were not there. While a slot migrates, a writer may then not keep readers out, or a
--    fair waiter not keep its place; no grant is ever made or refused for it against the lock
--    key itself.
--
-- The release channel is an argument too: `PUBLISH`/`SPUBLISH` take it from ARGV.

local function not_a_lock(key, what)
  error({err = 'NOTALOCK ' .. what .. ' at ' .. key})
end

-- 32 hex digits, ':', digits, ':' (a literal: a script call builds no string for it).
local OWNER = '^%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x:%d+:'

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
    local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if string.find(top[1], '^#permits:%d+$') and top[2] == 'inf' then
      return 'permits', top[1]
    elseif is_owner(top[1]) then
      return 'readers', top[1]
    end
  end
  not_a_lock(key, held)
end

-- Tokens are Lua numbers, doubles, which hold every integer only below 2^53.
local TOKEN_LIMIT = 9007199254740992

-- The fencing counter `key` (Redlock) as it is, for a look that grants nothing (`inspect`):
-- its value, or nil when absent. Anything else there (another application's data) is
-- NOTALOCK: a counter is only ever written as decimal digits (`%d`), so a string that Lua
-- would also read as a number ('1e20', '0x1f', '-5', '12.5', ' 7') is not one of ours.
local function counter_value(key)
  local last = redis.pcall('GET', key)
  if (type(last) == 'table' and last.err) or (last and not string.find(last, '^%d+$')) then
    not_a_lock(key, redis.call('TYPE', key)['ok'])
  end
  return tonumber(last)
end

-- A token of 2^53 or more, from the counter `key` or to be written there: FENCETOOLARGE,
-- `value` as the caller has it (the exact digits, not the rounded double).
local function refuse_too_large(key, value)
  error({err = 'FENCETOOLARGE ' .. value .. ' at ' .. key})
end

-- The fencing counter `key` (Redlock) for a script that grants or raises a token: its value,
-- or nil when absent. Anything else there is NOTALOCK (`counter_value`), and a value of 2^53
-- or more FENCETOOLARGE (no double above it is one more, so every proposal would be refused
-- as too low, forever, and a read grant's token would be rounded): raised before a script
-- writes a thing.
local function fencing_counter(key)
  local value = counter_value(key)
  if value and value >= TOKEN_LIMIT then
    refuse_too_large(key, redis.call('GET', key))
  end
  return value
end

-- A proposed token (Redlock, see redlock.rs) against one master: nil when it may be granted
-- (above the live counter `last`, not below the clock in microseconds), else the refusal
-- {2, hint, clock}: the hint is the least token this master would take now.
local function too_low(proposed, last, clock)
  if (last and last >= proposed) or clock > proposed then
    return {2, math.max(last or 0, clock) + 1, clock}
  end
  return nil
end

-- A proposed token that a grant would write to the counter `key` (`digits`: as the caller
-- sent it): FENCETOOLARGE at 2^53 or more, before anything is written, so that no script
-- writes a counter that `fencing_counter` would then refuse.
local function writable_token(key, token, digits)
  if token >= TOKEN_LIMIT then
    refuse_too_large(key, digits)
  end
end

-- A refusal from `too_low`, to be returned: FENCETOOLARGE instead when its hint is 2^53 or
-- more (the counter `key` at 2^53 - 1: no token above it can be written), so that no caller is
-- pointed at a token every script refuses. Raised before anything is written.
local function hint_below_limit(key, refusal)
  if refusal[2] >= TOKEN_LIMIT then
    refuse_too_large(key, redis.call('GET', key) or string.format('%d', refusal[3]))
  end
  return refusal
end

-- Sets the fencing counter `key` to `token` (below 2^53: `writable_token`) until the clock
-- has passed the token and then `ttl` ms more (`clock` in microseconds): while it lives, no
-- smaller token is granted; once it has lapsed, the clock, below which no token is granted,
-- is past it. Its time to live is how far the token runs ahead of this clock (a lead of at
-- most a second from a client whose clock agrees) plus `ttl`: whole milliseconds, written as
-- digits (below 2^53 / 1000 plus a lease of at most a year), never a number Redis could read
-- otherwise.
local function set_counter(key, token, clock, ttl)
  local ahead = math.max(0, math.floor(token / 1000) - math.floor(clock / 1000))
  redis.call('SET', key, string.format('%d', token), 'PX', string.format('%d', ahead + ttl))
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

-- Whether the writer-waiting mark `name` is up: its PTTL, -2 when it is not (or lives on the
-- other node of a migration). A key there that is not a mark ('1') is NOTALOCK.
local function writer_waiting(name)
  local ttl = beside('PTTL', name)
  if not ttl or ttl == -2 then
    return -2
  end
  local mark = redis.pcall('GET', name)
  if mark ~= '1' then
    not_a_lock(name, redis.call('TYPE', name)['ok'])
  end
  return ttl
end

-- Sets the writer-waiting mark `name` for `ms`, unless the key holds something that is not a
-- mark (NOTALOCK) or lives on the other node of a migration. NX GET: a missing mark is set in
-- one command, and nothing that is there is overwritten (a key of another type refuses the
-- GET, and with it the SET); a mark already up is given `ms` again.
local function mark_writer_waiting(name, ms)
  local found = redis.pcall('SET', name, '1', 'PX', ms, 'NX', 'GET')
  if type(found) == 'table' and found.err then
    if string.find(found.err, 'non local key', 1, true) then
      return
    elseif string.find(found.err, 'WRONGTYPE', 1, true) then
      not_a_lock(name, redis.call('TYPE', name)['ok'])
    end
    error(found)
  end
  if found == '1' then
    redis.call('PEXPIRE', name, ms)
  elseif found then
    not_a_lock(name, 'string')
  end
end

-- The first entry of the fair queue key `name` (a sorted set of 24-hex-digit waiter ids, or
-- absent) with its score, `{id, score}` (`{}` when empty): one read that checks the key and
-- finds its head (the queue) or its earliest deadline (the deadlines). Nil when it lives on
-- the other node of a migration, or, with `lenient`, when it holds something else; without
-- `lenient` something else is NOTALOCK.
local function queue_front(name, lenient)
  local first = redis.pcall('ZRANGE', name, 0, 0, 'WITHSCORES')
  if type(first) == 'table' and first.err then
    if string.find(first.err, 'non local key', 1, true) or lenient then
      return nil
    end
    not_a_lock(name, redis.call('TYPE', name)['ok'])
  end
  if first[1] == nil or string.find(first[1], '^%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x$') then
    return first
  end
  if lenient then
    return nil
  end
  not_a_lock(name, 'zset')
end

-- Whether the fair queue key `name` can be used (see `queue_front`).
local function own_queue(name, lenient)
  return queue_front(name, lenient) ~= nil
end
