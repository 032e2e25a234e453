-- Semaphore: take one of the key's N permits, in one round trip. While permits are held, the
-- lock key is a sorted set of their owner tokens, each scored by when its lease ends on the
-- server's clock (as readers are, read/acquire.lua), plus one marker member '#permits:N'
-- scored +inf: owner tokens never start with '#', and no purge ('-inf' up to now) removes it,
-- so the count N is known as long as the key lives, a call naming another count is refused,
-- and the holders are ZCARD - 1 once expired permits are purged. The key expires with its
-- longest lease, and a release deletes it when only the marker is left: a crashed holder's
-- permit comes back when its lease ends, with no clean-up needed.
--
-- KEYS[1]  lock key (a string while a writer holds it, a sorted set while readers or permit
--          holders do)
-- KEYS[2]  fencing counter (read, never written), only where tokens come from a counter
--          (Redlock); see write/acquire.lua
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  the number of permits N (at least 1)
-- (all keys share one hash tag)
--
-- Returns {1, token} when granted: token as a read grant's (read/acquire.lua): the latest
-- write token while the key's counter lives, else the server clock in microseconds.
-- {0, ms} when every permit is taken (ms: until the first permit's lease ends), or when a
-- writer or readers hold the key (ms: the key's PTTL, -1 without expiry). {-1, M} when the
-- key is a semaphore of M permits, M not N, and some permit of it is held: no silent resize.
-- A semaphore whose permits all ended takes the new count. A key that holds anything but a
-- lock, or a counter that holds anything but a number, is a NOTALOCK error, and a counter of
-- 2^53 or more a FENCETOOLARGE error; either way nothing is purged or written (lock_key.lua).
--
-- A call whose owner already holds a permit is the same try sent again after its reply was
-- lost: it is granted again, with the lease starting from now (never a second permit).

local held, top = lock_held(KEYS[1])
-- Before anything is purged or written, and whoever holds the lock: a counter of another
-- application's is NOTALOCK, one of 2^53 or more FENCETOOLARGE (lock_key.lua).
local last = KEYS[2] and fencing_counter(KEYS[2])
if held == 'writer' or held == 'readers' then
  -- A writer, or readers (a read lock, not a semaphore): wait for them like a writer.
  return {0, redis.call('PTTL', KEYS[1])}
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local lease = tonumber(ARGV[2])
local marker = '#permits:' .. ARGV[3]
if held == 'permits' then
  -- Purge before counting: an expired permit is a free one (the marker, scored +inf, stays).
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
  local holders = redis.call('ZCARD', KEYS[1]) - 1
  if top ~= marker then
    if holders > 0 then
      return {-1, tonumber(string.sub(top, 10)) or -1}
    end
    -- No permit held: the key takes the new count.
    redis.call('ZREM', KEYS[1], top)
  elseif holders >= tonumber(ARGV[3]) and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {0, math.max(tonumber(first[2]) - now_ms, 0)}
  end
end
redis.call('ZADD', KEYS[1], now_ms + lease, ARGV[1])
redis.call('ZADD', KEYS[1], '+inf', marker)
-- The key lives as long as its longest permit's lease.
if redis.call('PTTL', KEYS[1]) < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
if last then
  return {1, last}
end
return {1, tonumber(now[1]) * 1000000 + tonumber(now[2])}
