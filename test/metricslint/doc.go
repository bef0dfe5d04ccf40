// Package metricslint runs promlint over the metrics egret exposes, taken
// from real units after real traffic, so that every family that shows up
// on a node's /metrics is linted. It has no code outside its tests.
package metricslint
