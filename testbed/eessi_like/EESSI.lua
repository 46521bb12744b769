-- EESSI-like stack module for hpcstack.ops's tests and demo (Lmod >= 8.6).
--
-- testbed/eessilike.py installs this file, unchanged, as <root>/init/modules/EESSI/<version>.lua
-- next to <root>/versions/<version> (EESSI_PREFIX), so the version is the module's own and the
-- prefix follows from where the file is.
--
-- Detection works as EESSI's own module does, and so has its flaw: the archdetect wrappers
-- run through source_sh, Lmod stores what they exported in the module table (_ModuleTable*_),
-- and while the module stays loaded any later load replays that record instead of detecting
-- again. A job that inherits a login node's environment keeps the login node's CPU target
-- until the module is unloaded. eessi-arch-guard repairs exactly that.

help([[
EESSI-like software stack for tests: selects the software subdirectory of the most
specific CPU target of this node that the stack provides, and the accelerator subtree of
its GPU, as EESSI does.
]])
whatis("Description: EESSI-like software stack (hpcstack.ops test fixture)")
conflict("EESSI")

local version = myModuleVersion()
local root = myFileName():match("^(.*)/init/modules/EESSI/[^/]+%.lua$")
if root == nil then
    LmodError("EESSI-like module must be installed as <root>/init/modules/EESSI/<version>.lua, not "
              .. myFileName())
end
local os_type = "linux"
local prefix = pathJoin(root, "versions", version)
local init_prefix = pathJoin(prefix, "init")

-- Reads happen before source_sh: when unloading, source_sh undoes the wrapper's export
-- first, and the value is still needed to find the paths to remove.
local function cpu_candidates()
    local override = os.getenv("EESSI_ARCHDETECT_OPTIONS_OVERRIDE")
    local options = os.getenv("EESSI_ARCHDETECT_OPTIONS") or override
    if not override then
        source_sh("bash", pathJoin(init_prefix, "lmod_eessi_archdetect_wrapper.sh"))
        options = os.getenv("EESSI_ARCHDETECT_OPTIONS") or options
    end
    return options or ""
end

local function select_cpu(candidates)
    if candidates == "" then
        LmodError("EESSI-like: archdetect gave no CPU targets (run " .. init_prefix
                  .. "/eessi_archdetect.sh -d -a cpupath to see why)")
    end
    for candidate in candidates:gmatch("[^:]+") do
        if isDir(pathJoin(prefix, "software", os_type, candidate, "software")) then
            return candidate
        end
    end
    LmodError("EESSI-like: no software directory under " .. pathJoin(prefix, "software", os_type)
              .. " for any CPU target of this node (" .. candidates .. ")")
end

local function accelerator()
    local override = os.getenv("EESSI_ACCELERATOR_TARGET_OVERRIDE")
    local accel = os.getenv("EESSI_ACCEL_SUBDIR") or override
    if override then
        setenv("EESSI_ACCEL_SUBDIR", override)
        return override
    end
    source_sh("bash", pathJoin(init_prefix, "lmod_eessi_archdetect_wrapper_accel.sh"))
    return os.getenv("EESSI_ACCEL_SUBDIR") or accel or ""
end

local subdir = select_cpu(cpu_candidates())
local accel = accelerator()
-- As EESSI's module (2026): EESSI_CPU_FAMILY_OVERRIDE chooses the compatibility layer, whatever
-- the software target; without it the family is the target's.
local cpu_family = os.getenv("EESSI_CPU_FAMILY_OVERRIDE") or subdir:match("^[^/]+")
local eprefix = pathJoin(prefix, "compat", os_type, cpu_family)
local software_path = pathJoin(prefix, "software", os_type, subdir)
local module_path = pathJoin(software_path, "modules", "all")

-- A site's own installations for the same target: EESSI_SITE_SOFTWARE_PREFIX in place of the
-- repository's root, else host_injections in place of versions, as in EESSI's module (which
-- replaces with string.gsub; a test's temporary path can hold Lua's pattern characters, so
-- the leading part is replaced as plain text here).
local function replace_leading(path, old, new)
    if path:sub(1, #old) == old then
        return new .. path:sub(#old + 1)
    end
    return path
end
local site_prefix = os.getenv("EESSI_SITE_SOFTWARE_PREFIX")
local site_software_path
if site_prefix then
    site_software_path = replace_leading(software_path, root, site_prefix)
else
    site_software_path = replace_leading(software_path, pathJoin(root, "versions"), pathJoin(root, "host_injections"))
end
local site_module_path = pathJoin(site_software_path, "modules", "all")

setenv("EESSI_VERSION", version)
setenv("EESSI_PREFIX", prefix)
setenv("EESSI_INIT_PREFIX", init_prefix)
setenv("EESSI_OS_TYPE", os_type)
setenv("EESSI_CPU_FAMILY", cpu_family)
setenv("EPREFIX", eprefix)
setenv("EESSI_EPREFIX", eprefix)
setenv("EESSI_SITE_SOFTWARE_PATH", site_software_path)
setenv("EESSI_SITE_MODULEPATH", site_module_path)
setenv("EESSI_SOFTWARE_SUBDIR", subdir)
setenv("EESSI_SOFTWARE_PATH", software_path)
setenv("EESSI_MODULEPATH", module_path)
prepend_path("PATH", pathJoin(eprefix, "bin"))
prepend_path("PATH", pathJoin(eprefix, "usr", "bin"))
if mode() ~= "spider" then
    prepend_path("MODULEPATH", module_path)
end
prepend_path("LMOD_RC", pathJoin(software_path, ".lmod", "lmodrc.lua"))
prepend_path("LMOD_RC", pathJoin(site_software_path, ".lmod", "lmodrc.lua"))
pushenv("LMOD_PACKAGE_PATH", pathJoin(software_path, ".lmod"))

local accel_module_path
if accel ~= "" then
    -- The CPU subdirectory of the accelerator's installations is the target's, unless the
    -- user or site says otherwise.
    local accel_subdir = os.getenv("EESSI_ACCEL_SOFTWARE_SUBDIR_OVERRIDE") or subdir
    accel_module_path = pathJoin(prefix, "software", os_type, accel_subdir, accel, "modules", "all")
    if isDir(accel_module_path) then
        setenv("EESSI_ACCELERATOR_TARGET", accel)
        setenv("EESSI_MODULEPATH_ACCEL", accel_module_path)
        if mode() ~= "spider" then
            prepend_path("MODULEPATH", accel_module_path)
        end
    else
        accel_module_path = nil
    end
end

-- The site's module path last, so that it comes first.
prepend_path("MODULEPATH", site_module_path)
if accel_module_path then
    local site_accel_module_path
    if site_prefix then
        site_accel_module_path = replace_leading(accel_module_path, root, site_prefix)
    else
        site_accel_module_path = replace_leading(accel_module_path, pathJoin(root, "versions"),
                                                 pathJoin(root, "host_injections"))
    end
    if isDir(site_accel_module_path) then
        setenv("EESSI_SITE_MODULEPATH_ACCEL", site_accel_module_path)
        prepend_path("MODULEPATH", site_accel_module_path)
    end
end

-- As EESSI's module: a site may put it in an Lmod family or make it sticky.
local family_name = os.getenv("EESSI_MODULE_FAMILY_NAME")
if family_name then
    family(family_name)
end
if os.getenv("EESSI_MODULE_STICKY") then
    add_property("lmod", "sticky")
end

if mode() == "load" then
    LmodMessage("Module for EESSI/" .. version .. " (EESSI-like) loaded: " .. subdir
                .. (accel ~= "" and (" " .. accel) or ""))
end
