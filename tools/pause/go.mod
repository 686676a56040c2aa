module nodewright.local/rig/pause

go 1.26.0
