-- EESSI-like lmodrc.lua for hpcstack.ops's tests. testbed/eessilike.py installs it,
-- unchanged, as <software path>/.lmod/lmodrc.lua of every CPU target (and of a site's tree);
-- the EESSI module prepends it to LMOD_RC, as EESSI's does (EESSI's names its spider cache
-- there). Lmod reads the files of LMOD_RC when it needs its settings (properties such as
-- sticky, the spider cache).
--
-- With EESSI_LIKE_LMOD_READLOG set, reading it appends "lmodrc <this file>" there, so a test
-- sees which target's settings an Lmod process read.
local readlog = os.getenv("EESSI_LIKE_LMOD_READLOG")
if readlog and readlog ~= "" then
    local log = io.open(readlog, "a")
    if log then
        log:write("lmodrc ", debug.getinfo(1, "S").source:sub(2), "\n")
        log:close()
    end
end
scDescriptT = {}
