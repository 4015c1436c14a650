module gostw.test/inspect

go 1.19
