-- Reset the leases of many held grants in one round trip, each only if still held by the
-- caller. Grants of every kind can share a call (on Cluster, only keys of one slot can).
--
-- KEYS[i]      grant i's lock key (a string for a write grant, the readers' sorted set for a
--              read grant, the permit owners' sorted set for a semaphore permit)
-- ARGV[3i-2]   grant i's kind: 'w' (write) or 'r' (read, and a semaphore permit: its member's
--              score is reset as a reader's; the '#permits:N' marker is left alone)
-- ARGV[3i-1]   owner token of grant i
-- ARGV[3i]     new lease of grant i, in milliseconds
--
-- Returns an array: element i is 1 when grant i's lease was reset, 0 when it was no longer ours.

local extended = {}
local now_ms = nil
for i, key in ipairs(KEYS) do
  local owner = ARGV[3 * i - 1]
  local lease = tonumber(ARGV[3 * i])
  extended[i] = 0
  if ARGV[3 * i - 2] == 'w' then
    -- pcall: a key of the wrong type (not ours) must not fail the whole batch.
    if redis.pcall('GET', key) == owner then
      extended[i] = redis.call('PEXPIRE', key, lease)
    end
  else
    if not now_ms then
      local now = redis.call('TIME')
      now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    end
    -- pcall: the key is a string when a writer holds it (not ours).
    local score = redis.pcall('ZSCORE', key, owner)
    if type(score) == 'string' and tonumber(score) > now_ms then
      redis.call('ZADD', key, now_ms + lease, owner)
      if redis.call('PTTL', key) < lease then
        redis.call('PEXPIRE', key, lease)
      end
      extended[i] = 1
    end
  end
end
return extended
