-- What a fencing token is to the fenced scripts (`write.lua`, `raise.lua`), put before each of
-- them (`fenced.rs`): tokens are u64, and beyond 2^53 a Lua number loses digits, so they are
-- compared as decimal strings (a longer one is larger; of equal length, the byte order is the
-- numeric order), and a token is a decimal number with no sign and no leading zero.

local function below(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

local function is_token(s)
  return s == '0' or string.match(s, '^[1-9]%d*$') ~= nil
end
