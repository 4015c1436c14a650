module gostw.test/stackgrowth

go 1.19
