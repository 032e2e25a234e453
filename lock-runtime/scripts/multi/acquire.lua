-- Multi-key lock (lock_all): take the write lock of every key given, or of none, in one
-- script; each key gets its own fencing token. The keys of one call share a node (single
-- node, Sentinel, each Redlock master) or a hash slot (Cluster, one call per slot).
--
-- KEYS     per lock, ARGV[6] keys in a row: its lock key, and with counter tokens (Redlock)
--          its fencing counter (see write/acquire.lua)
-- ARGV[1]  owner token (one for every key of the grant)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  where the fencing tokens come from: 'clock', '0' (none), or 'T:ms' with counter
--          tokens (Redlock): every lock's proposed token T and its counter's time to live
--          beyond it (as write/acquire.lua)
-- ARGV[4]  time to live of the writer-waiting mark set on each key found held (0: none)
-- ARGV[5]  '1' when an earlier try of this request found a key held: a grant deletes the
--          marks of every key
-- ARGV[6]  keys per lock: 1, or 2 with counter tokens
-- ARGV[6 + i]  lock i's writer-waiting mark (arguments, not keys: lock_key.lua)
--
-- Returns {1, token per lock…} when every lock was free or ours (-1 per lock without
-- fencing); {2, hint, clock} when no lock is held but T is too low for a lock's counter or
-- the clock (as write/acquire.lua; nothing was taken; a proposal or a hint of 2^53 or more
-- is FENCETOOLARGE, as there); else {0, ms, i}: nothing was taken; ms is the longest time
-- one of the held locks is kept (its PTTL; -1 when one has no expiry), i the position (from
-- 1) of the first held lock, whose release the caller waits for. All or nothing: the locks are all looked at before
-- any is written. A lock already ours is the same try sent again after its reply was lost,
-- and is granted as if new (as in write/acquire.lua). A key that holds anything but a lock
-- is a NOTALOCK error, and nothing is written (lock_key.lua).

local stride = tonumber(ARGV[6])
local n = #KEYS / stride
-- Every key is looked at before anything is written: a key (or, on Redlock, a counter) that
-- holds another application's data is NOTALOCK with nothing changed (lock_key.lua).
local held_keys = {}
-- With counter tokens: the largest counter, and whether every lock is ours with its counter
-- at T (this very try sent again, granted again).
-- `last_key`: that counter's key (the first counter's while none lives).
local last, last_key, again = nil, KEYS[2], true
local proposed, counter_ttl, token
if stride == 2 then
  local ttl
  token, ttl = string.match(ARGV[3], '^(%d+):(%d+)$')
  proposed, counter_ttl = tonumber(token), tonumber(ttl)
end
for i = 1, n do
  local held, holder = lock_held(KEYS[(i - 1) * stride + 1])
  held_keys[i] = held ~= 'none' and holder ~= ARGV[1]
  if stride == 2 then
    local counter = fencing_counter(KEYS[i * 2])
    again = again and holder == ARGV[1] and counter == proposed
    if counter and (not last or counter > last) then
      last, last_key = counter, KEYS[i * 2]
    end
  end
end
if proposed then
  -- No counter of 2^53 or more is written (as write/acquire.lua).
  writable_token(KEYS[2], proposed, token)
end
local longest, first = -2, 0
for i = 1, n do
  if held_keys[i] then
    local lock = KEYS[(i - 1) * stride + 1]
    if first == 0 then
      first = i
    end
    if ARGV[4] ~= '0' then
      mark_writer_waiting(ARGV[6 + i], ARGV[4])
    end
    local ttl = redis.call('PTTL', lock)
    if ttl == -1 or longest == -1 then
      longest = -1
    elseif ttl > longest then
      longest = ttl
    end
  end
end
if first ~= 0 then
  return {0, longest, first}
end
local clock
if ARGV[3] ~= '0' then
  -- Scripts replicate their effects (default since Redis 5), so reading TIME is allowed.
  local now = redis.call('TIME')
  clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
end
if proposed and not again then
  local refusal = too_low(proposed, last, clock)
  if refusal then
    return hint_below_limit(last_key, refusal)
  end
end
for i = 1, n do
  redis.call('SET', KEYS[(i - 1) * stride + 1], ARGV[1], 'PX', ARGV[2])
  if ARGV[5] == '1' then
    beside('DEL', ARGV[6 + i])
  end
end
local reply = {1}
if ARGV[3] == '0' then
  for i = 1, n do
    reply[i + 1] = -1
  end
  return reply
end
for i = 1, n do
  local token = clock
  if proposed then
    token = proposed
    set_counter(KEYS[i * 2], proposed, clock, counter_ttl)
  end
  reply[i + 1] = token
end
return reply
