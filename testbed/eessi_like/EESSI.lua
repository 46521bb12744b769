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
local cpu_family = subdir:match("^[^/]+")
local eprefix = pathJoin(prefix, "compat", os_type, cpu_family)
local software_path = pathJoin(prefix, "software", os_type, subdir)
local module_path = pathJoin(software_path, "modules", "all")

setenv("EESSI_VERSION", version)
setenv("EESSI_PREFIX", prefix)
setenv("EESSI_INIT_PREFIX", init_prefix)
setenv("EESSI_OS_TYPE", os_type)
setenv("EESSI_CPU_FAMILY", cpu_family)
setenv("EPREFIX", eprefix)
setenv("EESSI_EPREFIX", eprefix)
setenv("EESSI_SOFTWARE_SUBDIR", subdir)
setenv("EESSI_SOFTWARE_PATH", software_path)
setenv("EESSI_MODULEPATH", module_path)
prepend_path("PATH", pathJoin(eprefix, "bin"))
prepend_path("PATH", pathJoin(eprefix, "usr", "bin"))
prepend_path("LMOD_RC", pathJoin(software_path, ".lmod", "lmodrc.lua"))
pushenv("LMOD_PACKAGE_PATH", pathJoin(software_path, ".lmod"))
if mode() ~= "spider" then
    prepend_path("MODULEPATH", module_path)
end

if accel ~= "" then
    local accel_module_path = pathJoin(software_path, accel, "modules", "all")
    if isDir(accel_module_path) then
        setenv("EESSI_ACCELERATOR_TARGET", accel)
        setenv("EESSI_MODULEPATH_ACCEL", accel_module_path)
        if mode() ~= "spider" then
            prepend_path("MODULEPATH", accel_module_path)
        end
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
