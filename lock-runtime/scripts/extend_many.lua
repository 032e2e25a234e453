-- Reset the leases of many held locks in one round trip, each only if still held by the caller.
--
-- KEYS[i]      lock key i
-- ARGV[2i-1]   owner token of lock i
-- ARGV[2i]     new lease of lock i, in milliseconds
--
-- Returns an array: element i is 1 when lock i's lease was reset, 0 when it was no longer ours.

local extended = {}
for i, key in ipairs(KEYS) do
  -- pcall: a key of the wrong type (not ours) must not fail the whole batch.
  if redis.pcall('GET', key) == ARGV[2 * i - 1] then
    extended[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  else
    extended[i] = 0
  end
end
return extended
