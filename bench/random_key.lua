-- Each request carries a random key from the file named by KEYS_FILE (one secret a line).
local keys = {}
for line in io.lines(os.getenv("KEYS_FILE")) do
  keys[#keys + 1] = line
end

request = function()
  wrk.headers["X-API-Key"] = keys[math.random(#keys)]
  return wrk.format("GET", "/api/v1/protected/test")
end
