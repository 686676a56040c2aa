-- Argo CD health check for NodeWright (nodewright.nvidia.com/v1alpha1): put this file's text in
-- argocd-cm under resource.customizations.health.nodewright.nvidia.com_NodeWright
-- (docs/install.md, "Argo CD"). Argo CD runs it with the object as the global `obj` and reads
-- the returned hs.status (Healthy, Progressing, Degraded, Suspended) and hs.message.
--
-- It reads what the status service writes (docs/api.md): status.observedGeneration, the Ready
-- condition (True exactly when every target node is complete for the current generation; its
-- reason is the rollout state, its message the node counts and the nodes that need
-- attention), status.state, status.nodeCounts and the problem conditions.
--
--   Healthy      Ready is True for the current generation
--   Suspended    paused or disabled (nodewright pause / disable), also while a deletion waits for that;
--                or nothing in progress and a compartment waiting for a person's approval
--                (approvalAfterBatches: nodewright approve), as Argo CD shows a paused Rollout
--   Degraded     a node failed, the rollout stopped at a failure gate, every remaining node is
--                blocked, the DeploymentPolicy is missing, node records do not decode, or a
--                deletion is blocked by any of these
--   Progressing  anything else: no status yet, a new generation not yet observed, nodes in
--                progress or waiting for their batch, window or priority, a deletion running
--
-- Lua 5.1 as Argo CD's interpreter (gopher-lua) runs it: only the base, string, table and
-- math libraries; tests/deploy/test_argocd_health.py runs it with lua5.1 and lua5.4.

local function conditionOf(o, ctype)
  if o.status == nil or o.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(o.status.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

local function isTrue(c)
  return c ~= nil and c.status == "True"
end

local function text(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local function health(o)
  local status = o.status
  local generation = o.metadata.generation or 0
  local ready = conditionOf(o, "Ready")

  if o.metadata.deletionTimestamp ~= nil then
    local blocked = conditionOf(o, "DeletionBlocked")
    if isTrue(blocked) then
      if blocked.reason == "PausedWithPendingUninstall" or blocked.reason == "DisabledWithPendingUninstall" then
        return "Suspended", "Deletion waits: " .. text(blocked, blocked.reason)
      end
      return "Degraded", "Deletion blocked: " .. text(blocked, blocked.reason)
    end
    local uninstalling = conditionOf(o, "UninstallInProgress")
    if isTrue(uninstalling) then
      return "Progressing", "Deleting: " .. text(uninstalling, "uninstalling packages")
    end
    return "Progressing", "Deleting"
  end

  if status == nil or status.observedGeneration == nil or status.observedGeneration < generation then
    return "Progressing", "Waiting for NodeWright to observe generation " .. tostring(generation)
  end
  if ready == nil or (ready.observedGeneration ~= nil and ready.observedGeneration < generation) then
    return "Progressing", "Waiting for the Ready condition of generation " .. tostring(generation)
  end
  if ready.status == "True" then
    return "Healthy", text(ready, "Ready")
  end

  local state = status.state or "Unknown"
  if state == "Paused" or state == "Disabled" then
    return "Suspended", state .. ": " .. text(ready, "no new node starts")
  end
  local stopped = conditionOf(o, "RolloutStopped")
  if state == "Stopped" or isTrue(stopped) then
    return "Degraded", "Stopped: " .. text(stopped, text(ready, "a compartment stopped"))
  end
  local failed = 0
  if status.nodeCounts ~= nil and status.nodeCounts.failed ~= nil then
    failed = status.nodeCounts.failed
  end
  if state == "Failed" or state == "Blocked" or failed > 0 then
    return "Degraded", state .. ": " .. text(ready, "nodes need attention")
  end
  local problems = { "DeploymentPolicyNotFound", "NodeStateMalformed" }
  for _, ctype in ipairs(problems) do
    local c = conditionOf(o, ctype)
    if isTrue(c) then
      return "Degraded", ctype .. ": " .. text(c, ctype)
    end
  end
  local inProgress = 0
  if status.nodeCounts ~= nil and status.nodeCounts.inProgress ~= nil then
    inProgress = status.nodeCounts.inProgress
  end
  if inProgress == 0 and status.compartments ~= nil then
    for _, c in ipairs(status.compartments) do
      if c.waitingReason == "BatchAwaitingApproval" then
        return "Suspended", "Awaiting approval: " .. (c.waitingMessage or c.name)
      end
    end
  end
  return "Progressing", state .. ": " .. text(ready, "rolling out")
end

local hs = {}
hs.status, hs.message = health(obj)
return hs
